"""The public model API: `load_model` and the `Model` it returns.

A Model holds the architecture spec, the weights (numpy arrays, by our parameter names, in
the chosen dtype) and the tokenizer. Each call compiles (once per shape, cached) a forward or
training Program from the model's DSL graph and runs it natively.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from surogate.autodiff import backward
from surogate.compile import Executable
from surogate.compile.executable import DerivedStore
from surogate.compile.fp8 import HISTORY_PREFIX, mark_fp8
from surogate.dsl.nn import LoRAConfig, ModelSpec
from surogate.errors import FileFormatError, InvalidArgumentError, UnsupportedError
from surogate.models import Family, family_for, family_for_gguf
from surogate.models.projectors import AdapterProjectors

DTYPES = ("float32", "bfloat16")
AUX_SEED = "daux_loss"  # the training graph input that seeds a MoE model's aux_loss with its coefficient
Z_SEED = "dz_loss"  # the same for its router z-loss (z_loss)
# Training-graph outputs beside the loss -> (seed input, the MoESpec field with its coefficient).
ROUTER_LOSSES = {"aux_loss": (AUX_SEED, "router_aux_loss_coef"), "z_loss": (Z_SEED, "router_z_loss_coef")}


def _np_dtype(name: str) -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def pack(sequences: Sequence[Sequence[int]] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids, position_ids, cu_seqlens) for one sequence or several packed documents."""
    if isinstance(sequences, np.ndarray) and sequences.ndim == 1:
        sequences = [sequences]
    elif sequences and np.isscalar(sequences[0]):
        sequences = [sequences]
    docs = [np.asarray(s, dtype=np.int64).reshape(-1) for s in sequences]
    if not docs or any(len(d) == 0 for d in docs):
        raise InvalidArgumentError("token_ids must hold at least one token per sequence")
    ids = np.concatenate(docs).astype(np.int32)
    pos = np.concatenate([np.arange(len(d), dtype=np.int32) for d in docs])
    cu = np.zeros(len(docs) + 1, dtype=np.int32)
    cu[1:] = np.cumsum([len(d) for d in docs])
    return ids, pos, cu


def shift_labels(sequences_labels: list[np.ndarray], ignore_index: int = -100) -> np.ndarray:
    """HF causal-LM semantics: token t predicts label t + 1; the last token of each document
    predicts nothing."""
    out = []
    for lab in sequences_labels:
        t = np.full(len(lab), ignore_index, dtype=np.int32)
        t[:-1] = lab[1:]
        out.append(t)
    return np.concatenate(out)


class Model:
    def __init__(self, spec: ModelSpec, family: Family, params: dict[str, np.ndarray], *, dtype: str = "float32",
                 device: str = "cpu", config: dict | None = None, tokenizer=None, path: str | None = None,
                 quant: dict[str, int] | None = None):
        if dtype not in DTYPES:
            raise InvalidArgumentError(f"dtype {dtype!r} is not supported", hint=f"use one of {', '.join(DTYPES)}")
        self.spec, self.family, self.params = spec, family, params
        self.dtype, self.device = dtype, device
        self.config = config or {}
        self.tokenizer = tokenizer
        self.path = path
        self.mmproj: str | None = None  # llama.cpp's mmproj file the vision tower came from (load_model(mmproj=))
        # Projection weights kept as GGML blocks (parameter -> ggml type): params holds their raw
        # uint8 rows and the Programs multiply them with gguf_matmul (inference only).
        self.quant = dict(quant or {})
        self.arch = family.architecture(spec)
        self._cache: dict[tuple, Executable] = {}
        self._derived = DerivedStore()  # what the shared executables derive from the weights (fp8 copies)
        self._on_device: dict[str, object] = {}  # GPU: one device copy of each weight, for every executable
        # stack_qkv: stacked name -> (its host array, [(part name, first row, rows)]); part -> stacked name
        self.stacks: dict[str, tuple[np.ndarray, list[tuple[str, int, int]]]] = {}
        self._stack_of: dict[str, str] = {}
        # Weights served from host memory (surogate/serve/offload.py): no device copy is made.
        self.host_only: set[str] = set()
        # Served adapters' multimodal projectors (train_projector), by key; the tower's weights stay one copy.
        self.projectors = AdapterProjectors(self)

    def device_param(self, name: str):
        """The device tensor mirroring params[name] (None on the CPU, where the array is the buffer)."""
        if self.device == "cpu":
            return None
        t = self._on_device.get(name)
        if t is None and name in self.host_only:
            raise UnsupportedError(f"{name} stays in host memory (the model serves with --cpu-offload-gb / "
                                   f"--offload-layers): only the serving runner reads it, streamed to {self.device}",
                                   hint="serve or run this model without weight offloading for this use "
                                        "(embeddings, logits, training)")
        if t is None:
            from surogate import _native

            stacked = self._stack_of.get(name)
            if stacked is not None:  # rows of the stack's one device copy
                _, parts = self.stacks[stacked]
                start, rows = next((a, n) for p, a, n in parts if p == name)
                t = self._on_device[name] = self.device_param(stacked).rows(start, rows)
            else:
                source = self.stacks[name][0] if name in self.stacks else self.params[name]
                t = self._on_device[name] = _native.tensor(source).to(self.device)
        return t

    def stack_qkv(self) -> list[str]:
        """Keep each layer's q, k and v projections (weights, and biases where all three have
        one) as row ranges of one array, ``layers.{i}.self_attn.qkv_proj.{weight,bias}`` (rows q,
        k, v: what the serving fusion binds, compile/fuse.py), the three parameters becoming views
        of it. A serving Program then reads the stack while training Programs read the parts: one
        copy of those weights, updated in place for both (GRPO's co-located engine). On a GPU the
        device copy is one tensor too (``device_param`` of a part is its rows). Executables built
        before are dropped (they hold the old arrays); the trainer calls this before it builds.
        Returns the stacks' names; quantized (GGML block) projections stay apart."""
        made = []
        for i in range(self.spec.num_layers):
            for kind in ("weight", "bias"):
                parts = [f"layers.{i}.self_attn.{p}_proj.{kind}" for p in "qkv"]
                name = f"layers.{i}.self_attn.qkv_proj.{kind}"
                if name in self.stacks or not all(p in self.params for p in parts) \
                        or any(p in self.quant for p in parts):
                    continue
                arrays = [self.params[p] for p in parts]
                if len({(a.dtype, a.shape[1:]) for a in arrays}) != 1:
                    continue
                stack = np.ascontiguousarray(np.concatenate(arrays, axis=0))
                rows, at = [], 0
                for p, a in zip(parts, arrays):
                    self.params[p] = stack[at:at + a.shape[0]]
                    rows.append((p, at, a.shape[0]))
                    self._stack_of[p] = name
                    self._on_device.pop(p, None)
                    at += a.shape[0]
                self.stacks[name] = (stack, rows)
                made.append(name)
        if made:
            self._cache.clear()
            self._derived.clear()
        return made

    def release_device_memory(self) -> None:
        """Drop the device copies of the weights and the executables that read them (a sleeping
        server); the host arrays stay, and the next use uploads again."""
        self._on_device.clear()
        self._cache.clear()
        self._derived.clear()
        self.projectors.release_device()

    # ---- compilation ------------------------------------------------------------------------
    def executable(self, mode: str, n_tokens: int, n_docs: int, lora: LoRAConfig | None = None,
                   grads: bool = False, recompute: bool = False, shared: bool = True,
                   mlp_chunk: int = 0, temperature: float = 1.0, images: int = 0,
                   projector=None, fp8=None, rewrite=None) -> Executable:
        """The compiled Program for this shape, bound to the model's weights; one per shape and
        setup (cached) unless ``shared`` is False: then a new one the caller may bind other
        weights to (DPO's frozen reference copy). ``temperature``: a train-mode loss over
        logits / temperature (GRPO). ``images`` (a model with ModelSpec.vision): the graph reads
        that many images' rows (mode "vision": the tower and projector over that many images).
        ``projector`` (mode "vision"): the key of a served adapter's projector (``projectors``)
        that the Program reads in place of the model's; None: the model's. ``fp8`` (an
        `Fp8Recipe`, surogate/compile/fp8.py): the block projections as FP8 GEMMs. ``rewrite``
        (with ``shared`` False): a pass over the lowered Program (`Executable`'s; ZeRO-3's gathers)."""
        assert rewrite is None or not shared, "a rewritten Program is its caller's own"
        key = (mode, n_tokens, n_docs,
               None if lora is None else lora.key(), grads,
               recompute) + ((mlp_chunk,) if mlp_chunk else ()) + ((temperature,) if temperature != 1.0 else ()) \
            + (("images", images) if images else ()) + (fp8.key() if fp8 is not None else ())
        exe = self._cache.get(key) if shared else None
        if exe is None and grads and lora is None and self.quant:
            name = next(iter(self.quant))
            raise UnsupportedError(f"{name} is kept as GGUF blocks, which have no gradient: a full fine-tune "
                                   "cannot update it", hint="train a LoRA over the blocks (QLoRA), or load the "
                                   "weights dequantized (the default) for a full fine-tune")
        if exe is None:
            g = self.arch.build(mode=mode, dtype=self.dtype, lora=lora, quant=self.quant,
                                **({"temperature": temperature} if temperature != 1.0 else {}),
                                **({"images": images} if images else {}))
            if mode == "vision":
                keep = list(g.outputs.values())
            else:
                keep = [g.outputs[{"train": "loss", "hidden": "hidden"}.get(mode, "logits")]]
            # A MoE model's load-balancing loss and router z-loss, each seeded with its coefficient.
            extra = {seed: g.outputs[out] for out, (seed, _) in ROUTER_LOSSES.items() if out in g.outputs}
            keep += list(extra.values())
            keep += g.moe_offsets  # each MoE layer's rows per expert (the trainer's expert-load metrics)
            if fp8 is not None:
                mark_fp8(g, fp8)
            if grads:
                backward(g, g.outputs["loss"], extra=extra or None)
            exe = Executable(g, {"N": n_tokens, "S1": n_docs + 1}, self.device, keep=keep, recompute=recompute,
                             mlp_chunk=mlp_chunk, rewrite=rewrite, derived=self._derived if shared else None)
            for name in exe.external_names("param"):
                if name in self.params:
                    exe.bind(name, self.params[name], self.device_param(name))
            if shared:
                self._cache[key] = exe
        if mode == "vision":  # (a pointer swap, when the last call read another projector)
            self.projectors.bind(exe, projector)
        return exe

    def _feed(self, exe: Executable, ids, pos, cu, lora_params: dict | None = None) -> None:
        exe.bind("input_ids", ids)
        if pos is not None:  # None: a graph with per-token rope tables instead (Qwen3-VL's MRoPE)
            exe.bind("position_ids", pos)
        exe.bind("cu_seqlens", cu)
        for name, arr in (lora_params or {}).items():
            exe.bind(name, np.ascontiguousarray(arr.astype(_np_dtype(self.dtype))))

    # ---- inference --------------------------------------------------------------------------
    def forward(self, token_ids, images=None, videos=None) -> np.ndarray:
        """Logits [T, V] (float32) for one sequence, or for several packed documents (each
        attends only to itself), in order. ``images`` (a model with images: pixel values
        [n, 3, S, S], the image processor's): the prompt's image tokens, in order, read the
        images' rows (`encode_images`), and each image span attends both ways within itself.
        Qwen3-VL: ``images`` / ``videos`` = (pixel rows, grid_thw) as its processors give them
        (models/qwen3_vl.py visual_inputs: merged rows, DeepStack, MRoPE positions)."""
        ids, pos, cu = pack(token_ids)
        self._check_ids(ids)
        exe = self._image_feed(ids, pos, cu, images, "logits", videos=videos)
        exe.run()
        return np.array(exe.read("logits"), dtype=np.float32)

    def encode_images(self, pixel_values, grid_thw=None, *, hidden: bool = False, pooled: bool = False,
                      projector=None) -> np.ndarray:
        """The rows that replace the image tokens' embeddings: [n * mm_tokens_per_image, hidden]
        float32 for pixel values [n, channels, S, S] (the projector's output, used as it is: no
        embedding scale). ``hidden``: the tower's last hidden state [n * patches, vision hidden]
        instead (HF's vision_tower(...).last_hidden_state); ``pooled``: it pooled to the image
        tokens [n * mm_tokens_per_image, vision hidden] (a trainable projector's input). Qwen3-VL: pixel rows with their
        ``grid_thw``; returns (merged rows, DeepStack rows) (models/qwen3_vl.py encode_visual).
        ``projector``: a served adapter's projector (its key in ``projectors``) after the model's tower."""
        return self._vision_hooks().encode(self, pixel_values, grid_thw, hidden, pooled, projector)

    @property
    def np_dtype(self) -> np.dtype:
        """The numpy dtype of the model's weights and activations (``dtype``'s)."""
        return _np_dtype(self.dtype)

    def _vision_hooks(self):
        if self.spec.vision is None or self.family.vision is None:
            raise UnsupportedError(f"{self.spec.family}: this model takes no images",
                                   hint="load a checkpoint with a vision tower (Gemma3ForConditionalGeneration)")
        return self.family.vision

    def _image_feed(self, ids, pos, cu, images, mode: str, lora_params: dict | None = None, videos=None,
                    **kw) -> Executable:
        """The executable of ``mode`` (``kw``: `executable`'s setup) fed with the packed tokens, and
        with the images' rows when there are images."""
        got = None
        if images is not None or videos is not None or self.spec.vision is not None:
            got = self._vision_hooks().inputs(self, ids, pos, cu, images, videos)
        if got is None:
            exe = self.executable(mode, len(ids), len(cu) - 1, **kw)
            self._feed(exe, ids, pos, cu, lora_params)
            return exe
        key, feed_ids, feed_pos, feed = got
        exe = self.executable(mode, len(ids), len(cu) - 1, images=key, **kw)
        self._feed(exe, feed_ids, feed_pos, cu, lora_params)
        for name, arr in feed.items():
            exe.bind(name, arr)
        return exe

    def hidden_states(self, token_ids, pad_to: int | None = None, pad_docs_to: int | None = None) -> np.ndarray:
        """The final hidden states [T, C] (float32, after the final norm: HF's last_hidden_state)
        of one sequence or several packed documents (each attends only to itself). ``pad_to`` /
        ``pad_docs_to``: run the Program of at least that many tokens / documents (padding
        documents of their own, dropped after), so that inputs of nearby shapes share one
        compiled Program."""
        ids, pos, cu = pack(token_ids)
        self._check_ids(ids)
        T, n = len(ids), len(cu) - 1
        docs = max(pad_docs_to or 0, n + (1 if pad_to is not None and pad_to > T else 0))
        if docs > n:  # one token each, the last one taking the rest
            tokens = max(pad_to or 0, T + docs - n)
            lens = [1] * (docs - n - 1) + [tokens - T - (docs - n - 1)]
            ids = np.concatenate([ids, np.zeros(tokens - T, np.int32)])
            pos = np.concatenate([pos, *[np.arange(k, dtype=np.int32) for k in lens]])
            cu = np.concatenate([cu, T + np.cumsum(lens)]).astype(np.int32)
        exe = self.executable("hidden", len(ids), len(cu) - 1)
        self._feed(exe, ids, pos, cu)
        exe.run()
        return np.array(exe.read(exe.graph.outputs["hidden"].name), dtype=np.float32)[:T]

    def loss(self, token_ids, labels=None, images=None, videos=None) -> float:
        """Mean next-token cross-entropy, HF semantics (labels default to the inputs; -100 is
        ignored; the shift happens here). ``images`` / ``videos``: as in `forward`."""
        value, _ = self._train_step(token_ids, labels, grads=False, images=images, videos=videos)
        return value

    def loss_and_grads(self, token_ids, labels=None, lora: LoRAConfig | None = None,
                       lora_params: dict[str, np.ndarray] | None = None,
                       recompute: bool = False, mlp_chunk: int = 0, images=None,
                       videos=None, fp8=None) -> tuple[float, dict[str, np.ndarray]]:
        """Loss and the gradient of every trainable parameter (all weights for a full fine-tune,
        the LoRA A/B matrices with `lora`), by our parameter names. ``images``: as in `forward`
        (the tower and projector stay frozen: no gradient of theirs). ``fp8``: an `Fp8Recipe`
        (delayed scaling starts from empty amax histories)."""
        return self._train_step(token_ids, labels, grads=True, lora=lora, lora_params=lora_params,
                                recompute=recompute, mlp_chunk=mlp_chunk, images=images, videos=videos, fp8=fp8)

    def _train_step(self, token_ids, labels, grads: bool, lora=None, lora_params=None, recompute=False,
                    mlp_chunk=0, images=None, videos=None, fp8=None):
        if lora is not None and lora_params is None:
            raise InvalidArgumentError("lora_params is required with lora: the adapter matrices to differentiate",
                                       hint="surogate.train.lora.init_lora(model.arch.build(mode='train', "
                                            "lora=lora), seed) gives peft's initialisation")
        ids, pos, cu = pack(token_ids)
        self._check_ids(ids)
        docs = np.split(ids, cu[1:-1])
        if labels is None:
            label_docs = docs
        else:
            _, _, lcu = pack(labels)
            if not np.array_equal(lcu, cu):
                raise InvalidArgumentError("labels must have the same lengths as token_ids")
            label_docs = np.split(np.concatenate([np.asarray(x).reshape(-1) for x in
                                                  ([labels] if np.isscalar(labels[0]) else labels)]), cu[1:-1])
        targets = shift_labels(label_docs)
        valid = targets != -100
        n_valid = int(valid.sum())
        exe = self._image_feed(ids, pos, cu, images, "train", lora_params, videos=videos, lora=lora, grads=grads,
                               recompute=recompute, mlp_chunk=mlp_chunk, fp8=fp8)
        exe.bind("targets", targets)
        for name in exe.external_names("input"):
            if name.startswith(HISTORY_PREFIX):
                exe.bind(name, np.zeros(exe.buf(name).shape, np.float32))
        out = {}
        if grads:
            exe.bind("dloss", np.where(valid, 1.0 / max(n_valid, 1), 0.0).astype(np.float32))
            for name in exe.external_names("grad"):
                arr = np.zeros(exe.buf(name).shape, np.float32)
                exe.bind(name, arr)
                out[name[len("grad."):]] = arr
        if grads:
            bind_router_loss_seeds(exe, self.spec)
        exe.run()
        for name in list(out):
            out[name] = exe.pull("grad." + name)
        per_token = exe.read("loss")
        value = float(per_token[valid].sum() / max(n_valid, 1))
        for out_name, (_, field) in ROUTER_LOSSES.items():  # HF: loss + router_aux_loss_coef * aux_loss
            if out_name in exe.graph.outputs:
                value += getattr(self.spec.moe, field) * float(exe.read(out_name)[0])
        return value, out

    def _check_ids(self, ids: np.ndarray) -> None:
        if self.spec.vision is not None:  # the image token may lie past the vocabulary (HF reads it as 0)
            ids = np.where(ids == self.spec.vision.image_token_index, 0, ids)
        if ids.min() < 0 or ids.max() >= self.spec.vocab_size:
            bad = int(ids[(ids < 0) | (ids >= self.spec.vocab_size)][0])
            raise InvalidArgumentError(f"token id {bad} is outside the vocabulary (size {self.spec.vocab_size})")

    # ---- names ------------------------------------------------------------------------------
    def to_hf(self, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Our parameter-named tensors (weights or gradients) under the checkpoint's names."""
        # A fused tensor's parts are equal (gate and up; Gemma 4's layers have their own widths).
        return self.family.name_table().export(
            tensors, lambda name, r: [tensors[name].shape[r.axis] // len(r.hf)] * len(r.hf))

    def __repr__(self) -> str:
        s = self.spec
        return (f"Model({s.family}, layers={s.num_layers}, hidden={s.hidden_size}, heads={s.num_heads}/"
                f"{s.num_kv_heads}, vocab={s.vocab_size}, dtype={self.dtype}, device={self.device})")


def bind_router_loss_seeds(exe: Executable, spec: ModelSpec) -> None:
    """A MoE training Program's load-balancing and z-loss seeds: their coefficients (the loss's
    gradient with respect to each), where the Program has them."""
    for out, (seed, field) in ROUTER_LOSSES.items():
        if out in exe.graph.outputs and seed in exe.lowered.by_value:
            exe.bind(seed, np.array([getattr(spec.moe, field)], np.float32))


def resolve_device(device: str) -> str:
    """'cpu', 'cuda' or 'cuda:N' checked against this build and machine; 'auto' picks a GPU when
    there is one."""
    from surogate import _native

    gpus = _native.cuda_devices() if _native.build_info()["cuda"] else []
    if device == "auto":
        return "cuda" if gpus else "cpu"
    if device == "cpu":
        return device
    if not device.startswith("cuda"):
        raise InvalidArgumentError(f"unknown device {device!r}", hint="use 'cpu', 'cuda', 'cuda:N' or 'auto'")
    if not _native.build_info()["cuda"]:
        raise UnsupportedError("this surogate was built without the CUDA backend",
                               hint="reinstall on a machine with the CUDA toolkit (SUROGATE_CUDA=ON), or use 'cpu'")
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if index >= len(gpus):
        raise UnsupportedError(f"{device}: this machine has {len(gpus)} CUDA device(s)",
                               hint="run `surogate doctor` to see the GPUs and the driver")
    return device


def load_model(path_or_id: str | Path, device: str = "cpu", dtype: str = "float32", *,
               download: bool = False, quantized: bool = False, quantize: str | None = None,
               nf4=None, mmproj: str | Path | None = None) -> Model:
    """Load a Hugging Face model folder (or a hub id found in the local cache), or a GGUF file:
    its tensors dequantized to ``dtype`` at load, or with ``quantized`` its quantized projection
    weights kept as GGML blocks and multiplied as they are (llama.cpp's way: a fraction of the
    memory). ``quantize`` (a `surogate quantize` type: Q8_0, Q6_K, Q5_K_M, Q4_K_M) turns the
    projection weights of any checkpoint into such blocks at load instead. Blocks are frozen:
    a LoRA trains over them (QLoRA), the gradient reaching the input through the dequantized
    weight. ``quantize="NF4"``: bitsandbytes' NF4 instead (QLoRA's base), with ``nf4`` an
    `NF4Spec` (block size, double quantization; default 64 and on). ``mmproj``: with a GGUF file,
    llama.cpp's mmproj file of its vision tower (convert_hf_to_gguf.py --mmproj, `surogate
    quantize`'s mmproj-*.gguf): the model takes images as the HF checkpoint does."""
    from surogate.io import ModelFolder, Tokenizer, resolve_model_path
    from surogate.io.nf4 import NF4Spec
    from surogate.io.gguf import GGUFFile, is_gguf

    device = resolve_device(device)
    if dtype not in DTYPES:
        raise InvalidArgumentError(f"dtype {dtype!r} is not supported", hint=f"use one of {', '.join(DTYPES)}")
    path = resolve_model_path(path_or_id, download=download)
    gguf = GGUFFile(path) if is_gguf(path) else None
    folder = None if gguf else ModelFolder(path)
    vision_gguf = None
    if mmproj is not None and not gguf:
        raise InvalidArgumentError(f"{path}: --mmproj (mmproj=) goes with a GGUF model; an HF folder holds its own "
                                   "vision tower",
                                   hint="serve the folder without --mmproj, or its GGUF with it")
    if gguf:
        family = family_for_gguf(gguf)
        config = family.gguf.config_from_gguf(gguf)
        if mmproj is not None:
            if family.gguf.mmproj is None:
                raise UnsupportedError(f"{mmproj}: the {family.name} family does not read llama.cpp's mmproj files",
                                       hint="serve it from the Hugging Face folder for images")
            vision_gguf = GGUFFile(resolve_model_path(mmproj))
            config = family.gguf.mmproj.config(config, vision_gguf, _gguf_tokenizer(gguf))
    else:
        config = folder.config
        family = family_for(config, source=str(Path(folder.path) / "config.json"))
    spec = family.spec_from_config(config)
    g = family.architecture(spec).build(mode="logits", dtype=dtype)
    graph_params = list(g.params())
    if spec.vision is not None:  # the vision tower and projector (their own graph)
        graph_params += list(family.architecture(spec).build(mode="vision", dtype=dtype).params())
    names = [p.name for p in graph_params]
    if quantized and not gguf:
        raise InvalidArgumentError(f"{path}: quantized=True keeps a GGUF file's blocks; this is not a GGUF file",
                                   hint="quantize it first: surogate quantize MODEL --type Q8_0 --output x.gguf, "
                                        "or quantize at load: quantize='Q4_K_M'")
    if quantized and quantize:
        raise InvalidArgumentError("quantized=True keeps the file's blocks; quantize= makes new ones: pick one")
    quant: dict[str, np.ndarray] = {}
    nf4 = nf4 or NF4Spec()
    if gguf:
        from surogate.models.gguf_names import load_gguf_params

        text_config = family.gguf.mmproj.text_config(config) if vision_gguf else config
        vision_names = set()
        if vision_gguf:  # the tower's and projector's parameters from the mmproj
            vision_names = {p.name for p in family.architecture(spec).build(mode="vision", dtype=dtype).params()}
        if quantized:
            text_projections = [p for p in projections(family.architecture(spec), dtype) if p.name not in vision_names]
            quant = _gguf_blocks(gguf, family, text_config, text_projections)
        params = load_gguf_params(gguf, family, text_config,
                                  [n for n in names if n not in quant and n not in vision_names], dtype)
        if vision_gguf:
            params.update(load_gguf_params(vision_gguf, family, config, sorted(vision_names), dtype,
                                           table=family.gguf.mmproj.tensors(config)))
        params.update({n: raw for n, (_, raw) in quant.items()})
        tokenizer = _gguf_tokenizer(gguf)
        source = path
    else:
        weights = folder.open_weights()  # block-FP8 checkpoints dequantized as they are read
        target = _np_dtype(dtype)
        hf_name = _checkpoint_names(weights, family)
        params = family.name_table().load(
            names, lambda hf: np.ascontiguousarray(weights.get(hf_name(hf)).astype(target)),
            has=lambda hf: hf_name(hf) in weights)
        # A weights-only folder still loads (token ids in, logits out); a damaged tokenizer does not.
        tokenizer = Tokenizer.from_folder(folder) if (folder.path / "tokenizer.json").is_file() else None
        source = folder.path
    if quantize and quantize.upper() == "NF4":
        quant = nf4_projections(params, projections(family.architecture(spec), dtype), nf4)
        for n, t in quant.items():
            params.update(t.tensors(n))
        quant = {n: (nf4, None) for n in quant}
    elif quantize:
        quant = _quantize_projections(params, projections(family.architecture(spec), dtype), quantize,
                                      spec.num_layers)
        params.update({n: raw for n, (_, raw) in quant.items()})
    for p in graph_params:
        if p.name not in quant and params[p.name].shape != p.shape:
            raise FileFormatError(
                f"{source}: tensor for {p.name} has shape {params[p.name].shape}, but the model's config implies "
                f"{p.shape}", hint="the weights and the config do not belong together")
    model = Model(spec, family, params, dtype=dtype, device=device, config=config, tokenizer=tokenizer,
                  path=str(path if gguf else folder.path), quant={n: t for n, (t, _) in quant.items()})
    model.mmproj = str(vision_gguf.path) if vision_gguf else None
    return model


def _gguf_tokenizer(gguf):
    from surogate.io import Tokenizer

    return Tokenizer.from_gguf(gguf) if "tokenizer.ggml.model" in gguf else None


def projections(arch, dtype: str) -> list:
    """The weights the training graph's ``linear`` nodes multiply and nothing else reads (attention,
    MLP and conv projections; not the embedding, the head, norms or stacked expert weights): what
    can be kept as blocks."""
    g = arch.build(mode="train", dtype=dtype)
    seen: dict[str, object] = {}
    elsewhere: set[str] = set()  # read by another op too (a head tied to the embedding)
    routers = {n.inputs[0].name for n in g.nodes if n.op.startswith("moe_router")}
    for n in g.nodes:
        if n.op == "linear" and n.outputs[0].name in routers:
            elsewhere.add(n.inputs[1].name)  # a MoE router stays in full precision, as llama.cpp keeps it
        elif n.op == "linear":
            seen.setdefault(n.inputs[1].name, n.inputs[1])
            elsewhere.update(v.name for i, v in enumerate(n.inputs) if v is not None and i != 1)
        else:
            elsewhere.update(v.name for v in n.inputs if v is not None)
    return [v for name, v in seen.items() if name not in elsewhere]


def nf4_projections(params: dict[str, np.ndarray], weights, spec) -> dict:
    """Each projection weight in bitsandbytes' NF4 layout (`NF4Weight`), as bnb's quantize_4bit
    makes it from the loaded values; a weight whose rows are no whole number of blocks stays as
    it is."""
    from surogate.io.nf4 import quantize_nf4

    return {p.name: quantize_nf4(params[p.name], spec.blocksize, spec.double_quant)
            for p in weights if p.shape[1] % spec.blocksize == 0}


def nf4_dequantized(model: Model) -> dict[str, np.ndarray]:
    """The model's parameters with every NF4 weight decoded to f32 and its state tensors dropped
    (what a merge writes, and what peft multiplies in the tests)."""
    from surogate.io.nf4 import NF4Weight, dequantize_nf4

    out = dict(model.params)
    for name, spec in model.quant.items():
        if hasattr(spec, "blocksize"):
            t = NF4Weight.from_tensors(out, name, spec)
            for k in t.tensors(name):
                out.pop(k)
            out[name] = dequantize_nf4(t)
    return out


def _quantize_projections(params: dict[str, np.ndarray], weights, qtype: str,
                          n_layers: int) -> dict[str, tuple[int, np.ndarray]]:
    """GGML blocks of the projection weights, by the `surogate quantize` recipe ``qtype`` (the _M
    recipes give v_proj and down_proj of some layers Q6_K, as llama.cpp does); a weight whose rows
    fall back to a float type stays as it is."""
    from surogate.io.gguf import ggml_type_id
    from surogate.io.gguf_writer import block_type, check_quant_type, quantize, use_more_bits

    qtype = check_quant_type(qtype)
    # llama-quantize counts attn_v tensors, not layers, where some layers have none (LFM2's conv
    # layers, Gemma 4's KV-shared ones): v_proj's choice takes its index among the v_projs.
    v_projs = [p.name for p in weights if p.name.endswith("v_proj.weight")]
    out = {}
    for p in weights:
        rows, cols = p.shape
        parts = p.name.split(".")
        where = (v_projs.index(p.name), len(v_projs)) if p.name in v_projs else (int(parts[1]), n_layers)
        more = (len(parts) > 2 and parts[0] == "layers" and parts[-2] in ("v_proj", "down_proj")
                and use_more_bits(*where))
        t = block_type(qtype, cols, more_bits=more)
        if t in ("F32", "F16", "BF16"):
            continue
        out[p.name] = (ggml_type_id(t), quantize(params[p.name], t, p.name))
    return out


def _base_model_names(weights):
    """The checkpoint's name for a name-table tensor: a base-model checkpoint (saved from HF's
    ``*Model`` class, not ``*ForCausalLM``: EmbeddingGemma's Gemma3TextModel) has every tensor
    without the ``model.`` prefix the tables use."""
    if any(k.startswith("model.") for k in weights.keys()):
        return lambda hf: hf
    return lambda hf: hf[len("model."):] if hf.startswith("model.") else hf


def _checkpoint_names(weights, family: Family):
    """The checkpoint's name for a name-table tensor: the first of the family's aliases for it that
    the checkpoint holds, else `_base_model_names`'."""
    base = _base_model_names(weights)
    if family.checkpoint_aliases is None:
        return base

    def name(hf: str) -> str:
        return next((a for a in family.checkpoint_aliases(hf) if a in weights), None) or base(hf)
    return name


def _gguf_blocks(gguf, family: Family, config: dict, projections) -> dict[str, tuple[int, np.ndarray]]:
    """The projection weights worth keeping as blocks: quantized types (a float type gains
    nothing), whose fused parts share one type; each as (ggml type, uint8 [rows, bytes per row])."""
    from surogate.io.gguf import ggml_type_id, row_bytes
    from surogate.models.gguf_names import GGUFWeights, gguf_blocks_for

    weights = GGUFWeights(gguf, family.gguf.tensors(), config)
    floats = {ggml_type_id(t) for t in ("F32", "F16", "BF16")}
    out = {}
    for p in projections:
        try:
            (t,) = gguf_blocks_for(weights, family.name_table(), [p.name]).values()
        except UnsupportedError:
            continue  # parts of different types: this one is dequantized
        if t.type in floats:
            continue
        t.check_supported()
        rows, cols = p.shape
        if t.shape != (rows, cols) or t.raw.shape != (rows, row_bytes(t.type, cols)):
            raise FileFormatError(f"{gguf.path}: tensor {t.name} has shape {t.shape}, but the model's config "
                                  f"implies {p.shape} for {p.name}",
                                  hint="the weights and the config do not belong together")
        out[p.name] = (t.type, np.ascontiguousarray(t.raw))
    return out
