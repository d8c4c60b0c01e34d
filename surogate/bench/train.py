"""`surogate bench train`: training-step throughput, ours and the peer's in the same run.

Ours: the model's training Program (forward, backward, AdamW) on random weights. The peer: HF
transformers (+ peft for LoRA, sdpa attention, torch's fused AdamW on a GPU) with the same
weights, tokens, labels and device, run after ours in the same process. Both see one batch of
`batch x seq` tokens (one document per row); the first step's losses must agree.

Reported per side: tokens/s and step time (median of the timed steps), peak device memory
(our caching allocator's peak; torch's max_memory_allocated) and model FLOPs utilization
(matmul FLOPs of the step over the chip's dense bf16 peak).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from surogate.bench.shapes import hf_config, hf_model_class, spec_for
from surogate.compile.fp8 import HISTORY_PREFIX, Fp8Recipe
from surogate.dsl.nn import LoRAConfig, ModelSpec
from surogate.model import Model, _np_dtype, bind_router_loss_seeds
from surogate.models import family_named
from surogate.train.lora import ALL_TARGETS, init_lora
from surogate.train.optimizer import AdamW, AdamWParams


@dataclass
class Result:
    name: str
    tokens_per_second: float
    step_seconds: float
    loss: float  # the first step's (before any update)
    peak_bytes: int = 0
    failed: str = ""  # why the side has no figures (the peer ran out of device memory)


PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense bf16, the vendors' datasheets


def step_flops(model: Model, batch: int, seq: int, lora: LoRAConfig | None) -> float:
    """Matmul FLOPs of one training step: 2 per weight per token forward, 2 more for the input
    gradient, 2 more for the weight gradient of a full fine-tune (a MoE layer's weights: the
    top_k experts a token runs and the router); attention's score and value products (causal:
    half); LoRA adapters are negligible and not counted."""
    s = model.spec
    n = batch * seq
    attn = s.hidden_size * (s.num_heads + 2 * s.num_kv_heads) * s.head_dim + s.num_heads * s.head_dim * s.hidden_size
    dense = 3 * s.hidden_size * s.intermediate_size
    moe = s.moe
    sparse = set(moe.layers) if moe is not None else set()
    # A MoE layer: the top_k experts a token runs (and the router), not all of them.
    routed = 3 * s.hidden_size * moe.intermediate_size * moe.top_k + s.hidden_size * moe.num_experts if moe else 0
    weights = sum(attn + (routed if i in sparse else dense) for i in range(s.num_layers)) + s.vocab_size * s.hidden_size
    passes = 4 if lora is not None else 6
    attn = 4 * s.num_layers * s.num_heads * s.head_dim * batch * seq * seq / 2  # QK^T and PV, causal
    return passes * weights * n + 3 * attn  # attention: forward once, backward twice


def peak_tflops(device: str) -> float | None:
    if device == "cpu":
        return None
    from surogate import _native

    name = _native.cuda_devices()[int(device.split(":")[1]) if ":" in device else 0]["name"]
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


RANDOM_POOL = 1 << 24  # distinct normal samples random weights are cut from (64 MiB of float32)


def random_model(shape: str | ModelSpec, dtype: str, seed: int = 0, device: str = "cpu") -> Model:
    """A named shape's (or a spec's) model with random weights: N(0, 0.02) (norm weights 1), each
    tensor cut from a pool of RANDOM_POOL normal samples at its own random offset (a 30B-parameter
    shape takes seconds instead of minutes of normal draws, and no float32 copy of the whole model
    is ever made: the pool is drawn in the model's dtype)."""
    spec = shape if isinstance(shape, ModelSpec) else spec_for(shape)
    family = family_named(spec.family)
    probe = Model(spec, family, {}, dtype=dtype)
    g = probe.arch.build(mode="logits", dtype=dtype)
    graph_params = list(g.params())
    if spec.vision is not None:  # the vision tower and projector (their own graph)
        graph_params += list(probe.arch.build(mode="vision", dtype=dtype).params())
    rng = np.random.default_rng(seed)
    np_dtype = _np_dtype(dtype)
    pool = (rng.standard_normal(RANDOM_POOL, dtype=np.float32) * 0.02).astype(np_dtype)
    params = {}
    for p in graph_params:
        n = math.prod(p.shape)
        if p.name.endswith("norm.weight"):
            params[p.name] = np.ones(p.shape, np_dtype)
            continue
        start = int(rng.integers(RANDOM_POOL))
        reps = -(-(start + n) // RANDOM_POOL)
        flat = pool[start:start + n] if reps == 1 else np.concatenate([pool[start:], *[pool] * (reps - 1)])[:n]
        params[p.name] = np.ascontiguousarray(flat).reshape(p.shape)
    return Model(spec, family, params, dtype=dtype, device=device)


def hf_peer(model: Model, device: str, dtype):
    """The peer: the transformers model of ``model``'s architecture built on ``device`` in ``dtype``
    (its own init runs there: no float32 host copy of a large model), holding ``model``'s weights,
    copied in a layer at a time (their checkpoint names from Model.to_hf)."""
    import torch

    spec = model.spec
    model_cls = hf_model_class(spec)
    cfg = model_cls.config_class(**hf_config(spec))
    # sdpa where the class has it (GPT-OSS's sinks: transformers runs it eager only)
    cfg._attn_implementation = "sdpa" if getattr(model_cls, "_supports_sdpa", False) else "eager"
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            m = model_cls(cfg)
    finally:
        torch.set_default_dtype(default)
    load_ours(m, model, getattr(model, "unquantized", model.params))
    return m


def load_ours(m, model: Model, weights: dict[str, np.ndarray]) -> None:
    """Copy our parameter-named ``weights`` into the transformers model ``m`` (every weight but
    lm_head and rotary buffers must find its tensor), a layer's tensors at a time."""
    import torch

    groups: dict[str, dict[str, np.ndarray]] = {}
    for k, v in weights.items():
        head = ".".join(k.split(".")[:2]) if k.startswith("layers.") else ""
        groups.setdefault(head, {})[k] = v
    state = m.state_dict()
    seen: set[str] = set()
    for group in groups.values():
        for name, arr in model.to_hf(group).items():
            if name not in state:
                raise AssertionError(f"the peer has no tensor {name}")
            arr = np.ascontiguousarray(arr)
            t = torch.from_numpy(arr.view(np.uint16)).view(torch.bfloat16) if arr.dtype.name == "bfloat16" \
                else torch.from_numpy(arr)
            with torch.no_grad():
                state[name].copy_(t.reshape(state[name].shape))
            seen.add(name)
    missing = [k for k in state if k not in seen and "lm_head" not in k and "rotary" not in k
               and not k.endswith("inv_freq")]
    assert not missing, missing


def batch_data(model: Model, batch: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and labels [batch, seq] (labels as HF takes them: shifted inside the model)."""
    rng = np.random.default_rng(1)
    v = model.spec.vocab_size
    return rng.integers(0, v, (batch, seq)).astype(np.int32), rng.integers(0, v, (batch, seq)).astype(np.int32)


def bench_ours(model: Model, batch: int, seq: int, lora: LoRAConfig | None, steps: int, warmup: int,
               recompute: bool, profile: bool = False, graphs: bool = True, mlp_chunk: int = 0,
               offload_optimizer: bool = False, fp8=None) -> Result:
    """``fp8``: an `Fp8Recipe` (recipe fp8_hybrid: the block projections as FP8 GEMMs)."""
    from surogate import _native
    from surogate.train.offload import HostAdamW

    n = batch * seq
    on_gpu = model.device != "cpu"
    if on_gpu:
        _native.reset_peak_stats(model.device)
    exe = model.executable("train", n, batch, lora=lora, grads=True, recompute=recompute, mlp_chunk=mlp_chunk, fp8=fp8)
    for name in exe.external_names("input"):  # delayed scaling's amax histories (none with current scaling)
        if name.startswith(HISTORY_PREFIX):
            exe.bind(name, np.zeros(exe.buf(name).shape, np.float32))
    if lora is not None:
        trainable = {k: v.astype(_np_dtype(model.dtype)) for k, v in init_lora(exe.graph, 0).items()}
        for k, v in trainable.items():
            exe.bind(k, v)
    else:
        trainable = {k: model.params[k] for k in exe.external_names("param")}
    for name in exe.external_names("grad"):
        exe.bind(name, np.zeros(exe.buf(name).shape, np.float32))
    opt = (HostAdamW if offload_optimizer and on_gpu else AdamW)(exe, trainable, AdamWParams(lr=1e-5))
    ids, labels = batch_data(model, batch, seq)
    targets = np.full((batch, seq), -100, np.int32)
    targets[:, :-1] = labels[:, 1:]  # HF's shift: token t predicts label t + 1
    valid = targets.reshape(-1) != -100
    exe.bind("input_ids", ids.reshape(-1))
    exe.bind("position_ids", np.tile(np.arange(seq, dtype=np.int32), batch))
    exe.bind("cu_seqlens", (np.arange(batch + 1) * seq).astype(np.int32))
    exe.bind("targets", targets.reshape(-1))
    exe.bind("dloss", np.where(valid, 1.0 / valid.sum(), 0.0).astype(np.float32))
    bind_router_loss_seeds(exe, model.spec)  # a MoE model's load-balancing (and z-) loss
    exe.use_graphs(graphs)
    times = []
    first_loss = float("nan")
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        exe.run("forward", "backward")
        opt.apply(1e-5)  # reads the grad norm back: the step has finished on the device
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        if i == 0:
            first_loss = float(exe.read("loss")[valid].mean())
    dt = float(np.median(times))
    peak = _native.allocator_stats(model.device)["peak_allocated_bytes"] if on_gpu else 0
    if profile:
        print(op_profile(exe, opt))
    name = "surogate (CUDA graphs)" if exe.program.graphs_active and exe.program.num_graphs else "surogate"
    if offload_optimizer and on_gpu:
        name += " + optimizer offload"
    if fp8 is not None:
        name += " fp8_hybrid"
    return Result(name, n / dt, dt, first_loss, peak)


def nf4_model(m, dtype, device: str):
    """The HF model reloaded as QLoRA loads it: bitsandbytes NF4 with double quantization and
    ``dtype`` compute (the weights saved once to a temporary folder; from_pretrained quantizes)."""
    import tempfile

    import transformers

    try:
        import bitsandbytes  # noqa: F401
    except ImportError as e:
        from surogate.errors import NotFoundError

        raise NotFoundError("--qlora --vs hf needs bitsandbytes (the peer's NF4 kernels)",
                            hint="pip install bitsandbytes, or leave out --vs hf") from e
    q = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                        bnb_4bit_compute_dtype=dtype)
    with tempfile.TemporaryDirectory() as tmp:
        m.to(dtype).save_pretrained(tmp)
        return transformers.AutoModelForCausalLM.from_pretrained(tmp, quantization_config=q, dtype=dtype,
                                                                 device_map={"": device})


def hf_label(lora: LoRAConfig | None, qlora: bool, checkpointing: bool) -> str:
    return ("HF transformers" + (" + peft" if lora is not None else "") + (" + bnb" if qlora else "")
            + (" + checkpointing" if checkpointing else ""))


def op_profile(exe, opt: AdamW, top: int = 15) -> str:
    """One more step with every op timed alone (waiting for the device after each): where the
    step's time goes, by op."""
    program = exe.program
    program.reset_profile()
    program.set_profiling(True)
    exe.run("forward", "backward")
    opt.apply(1e-5)
    program.set_profiling(False)
    rows = sorted(program.profile(), key=lambda r: -r[1])
    total = sum(t for _, t in rows) or 1.0
    lines = [f"\nper-op time of one step (each op synchronized: {total * 1e3:.1f} ms in all)"]
    lines += [f"  {name:22} {t * 1e3:9.2f} ms {100 * t / total:6.1f}%" for name, t in rows[:top]]
    # The matmuls by role: a projection's base weight, its LoRA adapters, the LM head.
    roles: dict[str, list[float]] = {}
    for i, t in enumerate(program.instr_profile()):
        text = program.instr(i)
        if text.startswith("matmul("):
            role = "lora" if "lora" in text else "forward" if ".grad" not in text else "backward"
            roles.setdefault(role, []).append(t)
    for role, ts in sorted(roles.items()):
        lines.append(f"  matmul/{role:15} {sum(ts) * 1e3:9.2f} ms in {len(ts)} calls")
    return "\n".join(lines)


def bench_hf(model: Model, batch: int, seq: int, lora: LoRAConfig | None, steps: int, warmup: int,
             device: str, qlora: bool = False, checkpointing: bool = False) -> Result:
    """The peer's step; ``checkpointing``: transformers' gradient checkpointing (non-reentrant),
    its counterpart of our recompute."""
    import torch

    dtype = torch.bfloat16 if model.dtype == "bfloat16" else torch.float32
    if qlora:
        m = hf_peer(model, "cpu", dtype)
        m = nf4_model(m, dtype, device)
    else:
        m = hf_peer(model, device, dtype)
    if checkpointing:
        m.config.use_cache = False
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if device != "cpu":
        torch.cuda.reset_peak_memory_stats(device)
    if lora is not None:
        import peft

        from surogate.dsl.nn import EXPERT_PARAMETERS, expert_lora
        from surogate.models.peft import peft_config

        # A MoE layer's stacked experts are peft's target_parameters (gate_up_proj at rank 2r, as ours)
        experts = [p for p in EXPERT_PARAMETERS if p in expert_lora(lora)] if model.spec.moe is not None else []
        c = peft_config(lora, list(lora.targets), experts, "bench")
        m = peft.get_peft_model(m, peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=c["target_modules"],
                                                   target_parameters=c["target_parameters"],
                                                   rank_pattern=c["rank_pattern"], alpha_pattern=c["alpha_pattern"],
                                                   lora_dropout=0.0))
    params = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, fused=device != "cpu")
    ids_np, labels_np = batch_data(model, batch, seq)
    ids = torch.tensor(ids_np, dtype=torch.long, device=device)
    labels = torch.tensor(labels_np, dtype=torch.long, device=device)
    times = []
    loss = float("nan")
    for i in range(warmup + steps):
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = m(input_ids=ids, labels=labels)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device != "cpu":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        if i == 0:
            loss = out.loss.item()
    dt = float(np.median(times))
    label = hf_label(lora, qlora, checkpointing)
    peak = torch.cuda.max_memory_allocated(device) if device != "cpu" else 0
    return Result(label, batch * seq / dt, dt, loss, peak)


def run(shape: str, *, batch: int, seq: int, lora_rank: int, dtype: str, steps: int, warmup: int, vs: str | None,
        device: str, recompute: bool, profile: bool = False, graphs: bool = True,
        qlora: str | None = None, long_context: bool = False, offload_optimizer: bool = False,
        fp8: bool = False) -> list[Result]:
    """``fp8``: ours under recipe fp8_hybrid first, then ours in ``dtype`` (the ratio's base
    without a peer)."""
    from surogate.errors import InvalidArgumentError
    from surogate.model import resolve_device

    device = resolve_device(device)
    if qlora and lora_rank <= 0:
        raise InvalidArgumentError("--qlora trains a LoRA over frozen blocks", hint="give --lora-rank > 0")
    model = random_model(shape, dtype, device=device)
    if qlora:
        model = quantized(model, qlora)
    lora = LoRAConfig(rank=lora_rank, alpha=2 * lora_rank, targets=ALL_TARGETS) if lora_rank > 0 else None
    chunk = min(batch * seq, model.spec.hidden_size) if long_context else 0  # the trainer's tiled-MLP rows
    if fp8 and (batch * seq) % 16:
        raise InvalidArgumentError(f"--fp8: {batch} x {seq} tokens is not a multiple of 16, which FP8 GEMMs need",
                                   hint="make --seq a multiple of 16")
    # A full fine-tune's steps update the model's weights in place: each side after the first
    # starts from the same weights (a host copy put back; the device copies uploaded again).
    start = {k: v.copy() for k, v in model.params.items()} if lora is None and (fp8 or vs) else None

    def restore() -> None:
        if start is not None:
            for k, v in start.items():
                model.params[k][...] = v
            model.release_device_memory()

    results = []
    if fp8:
        results.append(bench_ours(model, batch, seq, lora, steps, warmup, recompute, profile, graphs, chunk,
                                  offload_optimizer, fp8=Fp8Recipe()))
        restore()
    results.append(bench_ours(model, batch, seq, lora, steps, warmup, recompute, profile, graphs, chunk,
                              offload_optimizer))
    restore()
    if vs == "hf":
        if device != "cpu":
            from surogate import _native

            model.release_device_memory()  # our weights' device copies (a 30B shape: 61 GB) and Programs
            _native.empty_cache(device)  # give the peer the memory our cache holds
        import torch

        try:
            results.append(bench_hf(model, batch, seq, lora, steps, warmup, device, qlora=bool(qlora),
                                    checkpointing=recompute))
        except torch.OutOfMemoryError:  # a figure of its own: what the peer cannot run at this shape
            results.append(Result(hf_label(lora, bool(qlora), recompute), 0.0, 0.0, float("nan"),
                                  failed="out of device memory"))
            torch.cuda.empty_cache()
    print(table(shape, model, batch, seq, lora, dtype, device, steps, results, qlora))
    return results


def quantized(model: Model, qtype: str) -> Model:
    """The same random model with its projections as GGML blocks of ``qtype`` (what qlora_gguf
    trains over); the f32 originals stay with the host copy for the peer."""
    from surogate.io.nf4 import NF4Spec
    from surogate.model import _quantize_projections, nf4_projections, projections

    weights = projections(model.arch, model.dtype)
    if qtype.upper() == "NF4":  # bitsandbytes' NF4 (qlora_bnb), the peer's own format
        params, quant = dict(model.params), {}
        for n, t in nf4_projections(model.params, weights, NF4Spec()).items():
            params.update(t.tensors(n))
            quant[n] = NF4Spec()
    else:
        q = _quantize_projections(model.params, weights, qtype, model.spec.num_layers)
        params = dict(model.params) | {n: raw for n, (_, raw) in q.items()}
        quant = {n: t for n, (t, _) in q.items()}
    out = Model(model.spec, model.family, params, dtype=model.dtype, device=model.device, quant=quant)
    out.unquantized = model.params  # the peer quantizes the same weights its own way
    return out


def table(shape, model, batch, seq, lora, dtype, device, steps, results: list[Result], qlora: str | None = None) -> str:
    mode = f"LoRA r{lora.rank}" if lora else "full fine-tune"
    if qlora:
        ours = "bitsandbytes NF4" if qlora.upper() == "NF4" else f"{qlora.upper()} blocks"
        mode = f"QLoRA r{lora.rank} (ours: {ours}; peer: bitsandbytes NF4)"
    flops, peak = step_flops(model, batch, seq, lora), peak_tflops(device)
    w = max(22, *(len(r.name) for r in results))
    lines = [f"\n{shape}, {mode}, {dtype}, batch {batch} x {seq} tokens, {device}, median of {steps} steps",
             f"{'':{w}} {'tokens/s':>12} {'step (s)':>10} {'peak mem':>10} {'MFU':>6} {'loss@1':>8} {'ratio':>7}"]
    base = next(r.tokens_per_second for r in reversed(results) if not r.failed)
    for r in results:
        if r.failed:
            lines.append(f"{r.name:{w}} {r.failed}")
            continue
        mem = f"{r.peak_bytes / 2**30:.2f} GiB" if r.peak_bytes else "—"
        mfu = f"{100 * flops / r.step_seconds / (peak * 1e12):.1f}%" if peak else "—"
        lines.append(f"{r.name:{w}} {r.tokens_per_second:12,.0f} {r.step_seconds:10.3f} {mem:>10} {mfu:>6} "
                     f"{r.loss:8.4f} {r.tokens_per_second / base:6.2f}x")
    if len(results) > 1 and not results[1].failed:
        # (with fp8_hybrid: its loss against ours in the model's dtype; the peer's is in its row)
        a, b = results[0].loss, results[1].loss
        tol = 2e-2 if dtype == "bfloat16" else 1e-3
        verdict = "agree" if math.isclose(a, b, rel_tol=tol) else "DIFFER"
        lines.append(f"first-step losses {verdict} (ours {a:.4f}, peer {b:.4f}, tolerance {tol:g} relative)")
    return "\n".join(lines)
