"""Gemma 4 through GGUF (llama.cpp's "gemma4"), beyond the registry-driven writer and block tests:
every metadata key and tensor (name, shape, values) llama.cpp's converter writes and its loader
reads, read back by gguf-py; our loader against transformers on the very weights each file holds
(gguf-py dequantizes them and maps them back with its own name table), to 1e-4 whatever the type;
the hyper-parameters round-trip for the layouts Gemma 4 ships (per-layer inputs and KV sharing as
the E2B, K = V with its own kv heads as the 31B); a file written by gguf-py's GGUFWriter the way
convert_hf_to_gguf.py's Gemma4Model writes it (a stand-in for a real llama.cpp file, its
tokenizer made by the converter's own LlamaHfVocab) loads and runs as transformers does; the
gemma4 tokenizer both ways; and the errors for a file without a key, or a config llama.cpp
could not run.

The tiny model is Family.tiny.gguf: 4 layers (sliding, full, sliding, full), head dims 32 / 64,
the last two layers sharing K / V with double-wide MLPs, per-layer inputs of 256, soft-capping."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import gguf  # noqa: E402
from gguf import GGUFReader, GGUFWriter  # noqa: E402
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402
from sgtest import tiny_models  # noqa: E402

import surogate  # noqa: E402
from surogate.errors import FileFormatError, UnsupportedError  # noqa: E402
from surogate.io import GGUFFile, ModelFolder, Tokenizer  # noqa: E402
from surogate.io.gguf_tokenizer import gguf_tokenizer_metadata  # noqa: E402
from surogate.models import config_from_gguf, family_named  # noqa: E402
from surogate.models.gguf_names import quantize_to_gguf  # noqa: E402

FAMILY = family_named("gemma4")
TINY = dict(FAMILY.tiny.gguf)
A = "gemma4"
TEXT = "Hello world! The quick brown fox jumps over the lazy dog, again and again."


def hf_tensors(folder: Path) -> dict[str, np.ndarray]:
    weights = ModelFolder(folder).open_weights()
    return {name: np.array(weights.get(name), np.float32) for name in weights.keys()}  # noqa: SIM118


def gguf_py_name(hf_name: str, n_layers: int) -> str:
    """llama.cpp's name for an HF tensor by gguf-py's own table, as the converter asks it
    (Gemma4Model.filter_tensors gives the layer_scalar buffer its .weight first)."""
    if hf_name.endswith("layer_scalar"):
        hf_name += ".weight"
    name = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, n_layers).get_name(hf_name, try_suffixes=(".weight",))
    assert name is not None, hf_name
    return name


def transformers_logits(folder: Path, ids: list[int], state: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """transformers' logits from the folder's model, with ``state`` (HF names) loaded over it."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    if state is not None:
        own = model.state_dict()
        assert set(state) <= set(own)
        missing = set(own) - set(state) - {"lm_head.weight"}
        assert all("rotary_emb" in n for n in missing), missing  # only the rope buffers transformers makes itself
        model.load_state_dict({k: torch.from_numpy(np.array(v)).reshape(own[k].shape) for k, v in state.items()}, strict=False)
        if model.config.tie_word_embeddings:
            model.tie_weights()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def randomize_norms(folder: Path, seed: int = 3) -> None:
    """transformers starts every norm weight and layer scalar at 1: give them values, so that a
    norm read from the wrong tensor (or shifted by 1) shows in the logits."""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if (name.endswith("norm.weight") or name.endswith("layer_scalar")) and "rotary" not in name:
                t.copy_(1 + 0.3 * torch.randn(t.shape, generator=gen))
    model.save_pretrained(folder)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4")
    folder = tiny_models.make_model("gemma4", root / "hf", seed=4, initializer_range=0.05, **TINY)
    randomize_norms(folder)
    return folder, {t: quantize_to_gguf(folder, root / f"m.{t}.gguf", t) for t in ("F32", "Q8_0", "Q4_K_M")}


# ---- what the file holds, read back by gguf-py ------------------------------------------------

def test_metadata_is_llama_cpps(tiny):
    folder, files = tiny
    reader = GGUFReader(files["Q8_0"])
    meta = {k: f.contents() for k, f in reader.fields.items() if k.startswith(f"{A}.")}
    want = {
        "context_length": 256, "embedding_length": 256, "block_count": 4,
        "feed_forward_length": [512, 512, 1024, 1024],  # double-wide on the two KV-sharing layers
        "attention.head_count": 8, "attention.head_count_kv": 2,
        "attention.key_length": 64, "attention.value_length": 64,  # the full layers' (global_head_dim)
        "attention.key_length_swa": 32, "attention.value_length_swa": 32,
        "rope.dimension_count": 64, "rope.dimension_count_swa": 32,  # whole heads; rope_freqs holds the rest
        "rope.freq_base": 1e6, "rope.freq_base_swa": 1e4,
        "attention.sliding_window": 4, "attention.sliding_window_pattern": [True, False, True, False],
        "attention.shared_kv_layers": 2, "embedding_length_per_layer_input": 256,
        "final_logit_softcapping": 30.0, "vocab_size": 512,
    }
    assert meta.pop(f"{A}.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6)
    assert meta == {f"{A}.{k}": v for k, v in want.items()}
    assert reader.fields["general.architecture"].contents() == A
    assert reader.fields["general.file_type"].contents() == 7  # MOSTLY_Q8_0


def test_tensors_are_the_converters(tiny):
    """Names: gguf-py's table for every checkpoint tensor, plus rope_freqs; shapes: what
    llama_model_gemma4's loader creates (ggml order); values: norms as they are (no 1 added)."""
    folder, files = tiny
    source = hf_tensors(folder)
    reader = GGUFReader(files["F32"])
    got = {t.name: t for t in reader.tensors}
    assert set(got) == {gguf_py_name(n, 4) for n in source} | {"rope_freqs.weight"}
    kinds = {gguf.TENSOR_NAMES[k] for k in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.GEMMA4]}
    assert all(n.rsplit(".", 1)[0].replace(n.split(".")[1], "{bid}") in kinds if n.startswith("blk.")
               else n.rsplit(".", 1)[0] in kinds for n in got)
    C, V, P, L = 256, 512, 256, 4
    shape = {n: [int(d) for d in t.shape] for n, t in got.items()}
    assert shape["token_embd.weight"] == [C, V] and "output.weight" not in shape  # tied
    assert shape["per_layer_token_embd.weight"] == [P * L, V]
    assert shape["per_layer_model_proj.weight"] == [C, P * L] and shape["per_layer_proj_norm.weight"] == [P]
    assert shape["rope_freqs.weight"] == [64 // 2]
    for i, (D, F, own) in enumerate([(32, 512, True), (64, 512, True), (32, 1024, False), (64, 1024, False)]):
        b = f"blk.{i}."
        assert shape[b + "attn_q.weight"] == [C, 8 * D] and shape[b + "attn_output.weight"] == [8 * D, C]
        assert shape[b + "attn_q_norm.weight"] == [D]
        assert (b + "attn_k.weight" in shape) is own and (b + "attn_v.weight" in shape) is own  # shared: none
        if own:
            assert shape[b + "attn_k.weight"] == shape[b + "attn_v.weight"] == [C, 2 * D]
            assert shape[b + "attn_k_norm.weight"] == [D]
        assert shape[b + "ffn_gate.weight"] == shape[b + "ffn_up.weight"] == [C, F]
        assert shape[b + "ffn_down.weight"] == [F, C]
        assert shape[b + "inp_gate.weight"] == [C, P] and shape[b + "proj.weight"] == [P, C]
        assert shape[b + "layer_output_scale.weight"] == [1]
        for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "post_norm"):
            assert shape[b + norm + ".weight"] == [C]
    # Gemma 4's norms multiply by w (no 1 + w): llama.cpp stores w as it is.
    assert np.abs(source["model.layers.1.post_attention_layernorm.weight"] - 1).max() > 0.1  # randomize_norms
    np.testing.assert_array_equal(got["blk.1.post_attention_norm.weight"].data,
                                  source["model.layers.1.post_attention_layernorm.weight"])
    np.testing.assert_array_equal(got["blk.0.layer_output_scale.weight"].data, source["model.layers.0.layer_scalar"])
    # The converter's proportional rope: 64 * 0.25 / 2 = 8 pairs rotate, the other 24 get 1e30.
    np.testing.assert_array_equal(got["rope_freqs.weight"].data, np.array([1.0] * 8 + [1e30] * 24, np.float32))


# ---- logits ---------------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_K_M"])
def test_logits_equal_transformers_on_the_files_weights(tiny, qtype):
    """gguf-py decodes the file's blocks and its name table maps them back to HF names;
    transformers runs those weights: our loader must give its logits, whatever the rounding."""
    folder, files = tiny
    n = 4
    back = {gguf_py_name(name, n): name for name in hf_tensors(folder)}
    state = {back[t.name]: gguf_dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
             for t in GGUFReader(files[qtype]).tensors if t.name in back}
    ours = surogate.load_model(files[qtype])
    ids = ours.tokenizer.encode(TEXT)
    want = transformers_logits(folder, ids, state)
    np.testing.assert_allclose(ours.forward(ids), want, atol=1e-4, rtol=0)
    if qtype == "F32":  # and the file is the folder's model
        np.testing.assert_allclose(want, transformers_logits(folder, ids), atol=1e-4, rtol=0)


def spec_fields(spec) -> dict:
    d = dataclasses.asdict(spec)
    d.pop("family")
    return d


VARIANTS = {
    "e2b-like": {},
    # The 31B's layout: values from the key projection on full layers, with their own kv heads;
    # no sharing, no per-layer inputs, untied, no soft-capping.
    "31b-like": {"attention_k_eq_v": True, "num_global_key_value_heads": 1, "num_kv_shared_layers": 0,
                 "use_double_wide_mlp": False, "hidden_size_per_layer_input": 0, "tie_word_embeddings": False,
                 "final_logit_softcapping": None},
    # A scaled proportional rope over half the full head, another window and rope bases.
    "rope": {"sliding_window": 6, "num_kv_shared_layers": 0, "use_double_wide_mlp": False,
             "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 5e4},
                                 "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                                    "rope_theta": 2e5, "factor": 2.0}}},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_hyperparameters_round_trip(tmp_path, variant):
    folder = tiny_models.make_model("gemma4", tmp_path / "m", seed=1, **{**TINY, **VARIANTS[variant]})
    path = quantize_to_gguf(folder, tmp_path / "m.gguf", "F32")
    gf = GGUFFile(path)
    source = FAMILY.spec_from_config(json.loads((folder / "config.json").read_text()))
    read = FAMILY.spec_from_config(config_from_gguf(gf))
    a, b = spec_fields(read), spec_fields(source)
    assert a.pop("rms_norm_eps") == pytest.approx(b.pop("rms_norm_eps"), rel=1e-6)  # f32 in the file
    assert a == b
    if variant == "31b-like":
        assert gf.get(f"{A}.attention.head_count_kv") == [2, 1, 2, 1]
        assert {f"blk.{i}.attn_v.weight" for i in range(4)} & set(gf.tensors) == {"blk.0.attn_v.weight",
                                                                                   "blk.2.attn_v.weight"}
        assert "output.weight" in gf.tensors and f"{A}.final_logit_softcapping" not in gf.keys()
    ids = list(range(3, 40))
    want = transformers_logits(folder, ids)
    np.testing.assert_allclose(surogate.load_model(path).forward(ids), want, atol=1e-4, rtol=0)


# ---- a file in llama.cpp's layout -----------------------------------------------------------

GEMMA_CORPUS = [*tiny_models.CORPUS, "  two  spaces\n\n\nthree new lines", "<start_of_turn>user\nhi<end_of_turn>"]


def gemma_tokenizer(folder: Path, vocab_size: int) -> int:
    """A Gemma-style tokenizer.json in ``folder`` (byte-fallback BPE over characters, every
    space escaped to \u2581, <0xNN> byte tokens, Gemma's special tokens, a BOS added), of
    ``vocab_size`` tokens; returns the id of <bos>."""
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from tokenizers import Tokenizer as HFTokenizer

    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<|tool_call>", "<tool_call|>"]
    raw = HFTokenizer(models.BPE())
    raw.normalizer = normalizers.Replace(" ", "\u2581")
    raw.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated")
    n_pieces = vocab_size - len(special) - 256
    raw.train_from_iterator(GEMMA_CORPUS * 3, trainers.BpeTrainer(vocab_size=n_pieces, show_progress=False))
    spec = json.loads(raw.to_str())
    pieces = sorted(spec["model"]["vocab"], key=spec["model"]["vocab"].get)
    vocab = {t: i for i, t in enumerate([*special, *[f"<0x{b:02X}>" for b in range(256)], *pieces])}
    tok = HFTokenizer(models.BPE(vocab, [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
                                         for m in spec["model"]["merges"]], byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.post_processor = processors.TemplateProcessing(single="<bos>:0 $A:0", pair="<bos>:0 $A:0 <bos>:1 $B:1",
                                                       special_tokens=[("<bos>", vocab["<bos>"])])
    assert tok.get_vocab_size() == vocab_size
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
        "extra_special_tokens": special[4:],
        "chat_template": tiny_models.GEMMA_TEMPLATE}))
    for stale in ("special_tokens_map.json", "generation_config.json"):
        (folder / stale).unlink(missing_ok=True)
    return vocab["<bos>"]


class _Writer(GGUFWriter):
    """gguf-py's writer, less the keys a test drops."""

    def __init__(self, *args, drop=(), **kw):
        self.drop = set(drop)
        super().__init__(*args, **kw)

    def add_key_value(self, key, val, vtype, sub_type=None):
        if key not in self.drop:
            super().add_key_value(key, val, vtype, sub_type)


def write_llama_cpp_file(path: Path, folder: Path, hp: dict, *, drop=(), drop_tensors=(), rope_freqs=None,
                         extra: dict | None = None) -> Path:
    """What convert_hf_to_gguf.py's Gemma4Model writes (F32) for the HF folder, from ``hp``, the
    config.json keys as Google ships them (global_head_dim, num_global_key_value_heads): the
    calls of TextModel, Gemma3Model and Gemma4Model.set_gguf_parameters in turn, its tensors
    named by gguf-py (norms unshifted, token_embd cut to the tokenizer), generate_extra_tensors'
    rope_freqs, and set_vocab's tokenizer (gguf-py's LlamaHfVocab and SpecialVocab)."""
    n = hp["num_hidden_layers"]
    types = hp["layer_types"]
    w = _Writer(path, A, drop=drop)
    rope = hp["rope_parameters"]
    # TextModel
    w.add_block_count(n)
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(hp["num_key_value_heads"])
    w.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_key_length(hp["head_dim"])
    w.add_value_length(hp["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    # Gemma3Model
    if hp.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(hp["final_logit_softcapping"])
    w.add_sliding_window(hp["sliding_window"])
    # Gemma4Model
    shared = hp["num_kv_shared_layers"]
    w.add_shared_kv_layers(shared)
    w.add_embedding_length_per_layer_input(hp.get("hidden_size_per_layer_input") or 0)
    swa = [t == "sliding_attention" for t in types]
    w.add_sliding_window_pattern(swa)
    w.add_key_length(hp["global_head_dim"])
    w.add_value_length(hp["global_head_dim"])
    w.add_key_length_swa(hp["head_dim"])
    w.add_value_length_swa(hp["head_dim"])
    if hp.get("use_double_wide_mlp"):
        F = hp["intermediate_size"]
        w.add_feed_forward_length([F if i < n - shared else 2 * F for i in range(n)])
    if hp.get("num_global_key_value_heads") is not None:
        w.add_head_count_kv([hp["num_key_value_heads"] if s else hp["num_global_key_value_heads"] for s in swa])
    w.add_rope_dimension_count(hp["global_head_dim"])
    w.add_rope_dimension_count_swa(hp["head_dim"])
    # set_vocab
    vocab = gguf.LlamaHfVocab(folder)
    tokens, scores, toktypes = [], [], []
    for text, score, toktype in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        toktypes.append(gguf.TokenType.USER_DEFINED if text.decode() in ("<|tool_call>", "<tool_call|>") else toktype)
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(toktypes)
    gguf.SpecialVocab(folder, load_merges=True).add_to_gguf(w)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)
    # generate_extra_tensors, then the checkpoint
    head = hp["global_head_dim"]
    angles = int(head * rope["full_attention"]["partial_rotary_factor"] / 2)
    if "rope_freqs.weight" not in drop_tensors:
        w.add_tensor("rope_freqs.weight", np.array(rope_freqs if rope_freqs is not None else
                                                   [1.0] * angles + [1e30] * (head // 2 - angles), np.float32))
    for name, value in hf_tensors(folder).items():
        g = gguf_py_name(name, n)
        if g in drop_tensors:
            continue
        if name == "model.embed_tokens.weight":
            value = value[:len(tokens)]
        w.add_tensor(g, value)
    for name, value in (extra or {}).items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def llama_cpp_file(tmp_path_factory):
    """(HF folder with a Gemma-style tokenizer, Google-style hyper-parameters, the stand-in file)."""
    root = tmp_path_factory.mktemp("llama_cpp")
    changes = {**TINY, "num_global_key_value_heads": 1, "attention_k_eq_v": True, "num_kv_shared_layers": 2,
               "vocab_size": 400, "vocab_size_per_layer_input": 400}
    hp = {**FAMILY.tiny.config, **changes}
    folder = tiny_models.make_model("gemma4", root / "hf", seed=2, initializer_range=0.05, **changes)
    randomize_norms(folder)
    bos = gemma_tokenizer(folder, 400)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(bos_token_id=bos, eos_token_id=1, pad_token_id=0)
    (folder / "config.json").write_text(json.dumps(cfg))
    hp = {**hp, **{k: cfg[k] for k in ("layer_types", "rope_parameters", "max_position_embeddings", "rms_norm_eps",
                                       "sliding_window", "final_logit_softcapping")}}
    return folder, hp, write_llama_cpp_file(root / "llama_cpp.gguf", folder, hp)


def test_a_file_in_llama_cpps_layout_loads(llama_cpp_file):
    folder, hp, path = llama_cpp_file
    gf = GGUFFile(path)
    assert gf.get(f"{A}.attention.head_count_kv") == [2, 1, 2, 1] and "blk.1.attn_v.weight" not in gf.tensors
    assert gf.get(f"{A}.attention.shared_kv_layers") == 2 and "blk.3.attn_k.weight" not in gf.tensors
    model = surogate.load_model(path)
    source = FAMILY.spec_from_config(json.loads((folder / "config.json").read_text()))
    a, b = spec_fields(model.spec), spec_fields(source)
    assert a.pop("rms_norm_eps") == pytest.approx(b.pop("rms_norm_eps"), rel=1e-6)
    assert a == b
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = hf_tok(TEXT)["input_ids"]
    assert model.tokenizer.encode(TEXT) == ids and ids[0] == hf_tok.bos_token_id
    np.testing.assert_allclose(model.forward(ids), transformers_logits(folder, ids), atol=1e-4, rtol=0)


def test_a_llama_cpp_file_exported_as_an_hf_folder_runs_in_transformers(llama_cpp_file, tmp_path):
    """The config read from the file (per_layer_config, K = V, sharing) is one transformers builds."""
    from surogate.train.export import save_hf_folder

    _, _, path = llama_cpp_file
    model = surogate.load_model(path)
    folder = save_hf_folder(tmp_path / "hf", model.to_hf(model.params), model.config)
    ids = list(range(3, 40))
    np.testing.assert_allclose(transformers_logits(folder, ids), model.forward(ids), atol=1e-4, rtol=0)


def test_gemma4_tokenizer_both_ways(llama_cpp_file, tmp_path):
    """The converter's vocabulary (LlamaHfVocab: -1000 scores, <0xNN> as BYTE) and ours from the
    same tokenizer.json tokenize as transformers does, and ours writes what the converter writes."""
    folder, _, path = llama_cpp_file
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    theirs = Tokenizer.from_gguf(path)
    source = Tokenizer.from_folder(folder)
    meta = gguf_tokenizer_metadata(folder / "tokenizer.json", source, 400)
    reader = GGUFReader(path)
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                "tokenizer.ggml.merges", "tokenizer.ggml.add_space_prefix", "tokenizer.ggml.add_bos_token",
                "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        assert meta[key] == reader.fields[key].contents(), key
    w = GGUFWriter(tmp_path / "tok.gguf", A)
    from surogate.io.gguf_writer import _add_value

    for key, value in meta.items():
        _add_value(w, key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    ours = Tokenizer.from_gguf(tmp_path / "tok.gguf")
    texts = [*GEMMA_CORPUS, "Ünïcödé 🙂 falls back to bytes", "tabs\tand\r\nreturns", "  lead and trail  "]
    for text in texts:
        want = hf_tok(text)["input_ids"]
        assert theirs.encode(text) == want and ours.encode(text) == want, text
        assert ours.decode(want) == theirs.decode(want) == hf_tok.decode(want), text
        assert ours.encode(text, add_special_tokens=False) == want[1:]
    assert ours.decode(ours.encode("<start_of_turn>hi"), skip_special_tokens=True) == "hi"


# ---- errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["attention.sliding_window_pattern", "attention.key_length_swa",
                                 "attention.value_length_swa", "attention.sliding_window",
                                 "embedding_length_per_layer_input", "attention.layer_norm_rms_epsilon",
                                 "block_count", "feed_forward_length"])
def test_a_missing_key_is_named(llama_cpp_file, tmp_path, key):
    folder, hp, _ = llama_cpp_file
    path = write_llama_cpp_file(tmp_path / "x.gguf", folder, hp, drop=[f"{A}.{key}"])
    with pytest.raises(FileFormatError, match=f"metadata key {A}.{key} is missing"):
        surogate.load_model(path)


def test_rope_freqs_missing_or_not_proportional(llama_cpp_file, tmp_path):
    folder, hp, _ = llama_cpp_file
    path = write_llama_cpp_file(tmp_path / "a.gguf", folder, hp, drop_tensors=["rope_freqs.weight"])
    with pytest.raises(FileFormatError, match="no tensor rope_freqs.weight"):
        config_from_gguf(GGUFFile(path))
    path = write_llama_cpp_file(tmp_path / "b.gguf", folder, hp, rope_freqs=[1.0, 1e30, 1.0] + [1e30] * 29)
    with pytest.raises(UnsupportedError, match="rope_freqs.weight .* is not a proportional rope"):
        config_from_gguf(GGUFFile(path))


def test_a_mixture_of_experts_file_is_refused(llama_cpp_file, tmp_path):
    """gemma-4-26B-A4B's experts are not run here: its file must not load as the dense model around them."""
    folder, hp, _ = llama_cpp_file
    path = write_llama_cpp_file(tmp_path / "moe.gguf", folder, hp, extra={
        "blk.0.ffn_gate_inp.weight": np.zeros((4, 256), np.float32)})
    with pytest.raises(UnsupportedError, match="mixture-of-experts"):
        surogate.load_model(path)


def test_kv_sharing_llama_cpp_would_read_from_other_layers_is_refused(llama_cpp_file, tmp_path):
    folder, hp, _ = llama_cpp_file
    path = write_llama_cpp_file(tmp_path / "kv.gguf", folder, {**hp, "num_kv_shared_layers": 1})
    with pytest.raises(UnsupportedError, match="shared_kv_layers is 1: llama.cpp reads"):
        config_from_gguf(GGUFFile(path))


def test_a_last_sliding_layer_is_refused(llama_cpp_file, tmp_path):
    folder, hp, _ = llama_cpp_file
    types = ["sliding_attention", "full_attention", "full_attention", "sliding_attention"]
    path = write_llama_cpp_file(tmp_path / "s.gguf", folder, {**hp, "layer_types": types})
    with pytest.raises(UnsupportedError, match="makes the last layer sliding"):
        config_from_gguf(GGUFFile(path))


@pytest.mark.parametrize("overrides,key", [
    ({"vocab_size_per_layer_input": 1024}, "vocab_size_per_layer_input"),
    ({"hidden_activation": "silu"}, "hidden_activation"),
    ({"attention_bias": True}, "attention_bias"),
    # Layer 3 (full) would read layer 2's K / V in llama.cpp (a sliding one), layer 1's in transformers.
    ({"num_kv_shared_layers": 1}, "num_kv_shared_layers"),
])
def test_quantize_refuses_a_config_llama_cpp_would_run_differently(tmp_path, overrides, key):
    folder = tiny_models.make_model("gemma4", tmp_path / "m", **{**TINY, **overrides})
    with pytest.raises(UnsupportedError, match=f"config.json: {key} is .*llama.cpp's gemma4"):
        quantize_to_gguf(folder, tmp_path / "m.gguf", "Q8_0")
    assert not (tmp_path / "m.gguf").exists()
    shutil.rmtree(folder)
