"""Writing block-FP8 checkpoints (`surogate quantize MODEL --type FP8`): the e4m3 encoder bit for bit
torch's float8_e4m3fn cast; the block scales and codes equal to a torch reference (and to
transformers' FineGrainedFP8 quantizer); the folder in the layout of Qwen's *-FP8 releases (dense:
Qwen3-8B-FP8; Qwen3-MoE: Qwen3-30B-A3B-FP8, each expert's projections per 128 x 128 block, the
routers and norms kept and listed in modules_to_not_convert; Qwen3-VL: the vision tower kept and
listed), loaded by surogate and by transformers (its FineGrainedFP8 CPU path) with the logits of
its dequantized twin; a stacked-experts source written per expert; merge --type FP8 on a MoE;
partial blocks, shards, and the refusals (GGUF, already quantized, families not mapped)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import surogate  # noqa: E402
from sgtest.tiny_models import make_model, make_qwen3_vl, qwen3_vl_prompts  # noqa: E402
from sgtest.vision import qwen3_vl_hf_logits  # noqa: E402
from surogate.errors import InvalidArgumentError, UnsupportedError  # noqa: E402
from surogate.io import save_safetensors  # noqa: E402
from surogate.io.fp8_blocks import block_scale_inv, encode_e4m3, quantize_block_fp8  # noqa: E402
from surogate.io.safetensors import SafetensorsFile, open_safetensors  # noqa: E402
from surogate.train.export import quantize_to_fp8  # noqa: E402

# The config of Qwen/Qwen3-8B-FP8 (and the other Qwen3 *-FP8 releases): these four keys, no skip list.
RELEASE_QC = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
LINEAR = re.compile(r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight")
# Qwen3-30B-A3B-FP8's: the dense projections and each expert's (mlp.experts.{e}.gate_proj.weight ...).
MOE_LINEAR = re.compile(r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(experts\.\d+\.)?(gate|up|down)_proj)\.weight")


def torch_codes(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def torch_quantize(w: np.ndarray, block) -> tuple[np.ndarray, np.ndarray]:
    """The reference: DeepSeek's / vLLM's block quantization written in torch (scale = amax / 448,
    q = (w / scale) cast to e4m3), partial blocks padded with zeros."""
    t = torch.from_numpy(np.asarray(w, np.float32))
    bo, bi = block
    rows, cols = t.shape
    R, C = -(-rows // bo), -(-cols // bi)
    pad = torch.zeros(R * bo, C * bi)
    pad[:rows, :cols] = t
    amax = pad.reshape(R, bo, C, bi).abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    full = scale.repeat_interleave(bo, 0).repeat_interleave(bi, 1)[:rows, :cols]
    q = (t / full).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.view(torch.uint8).numpy(), scale.numpy()


def torch_dequantize(folder) -> dict[str, np.ndarray]:
    """Every tensor of an FP8 folder in f32, the FP8 ones as q * scale_inv per block (torch)."""
    block = json.loads((folder / "config.json").read_text())["quantization_config"]["weight_block_size"]
    index = folder / "model.safetensors.index.json"
    with open_safetensors(index if index.is_file() else folder / "model.safetensors") as f:
        raw = {n: torch.from_numpy(np.array(f.get(n)).view(np.uint8) if "float8" in str(f.get(n).dtype)
                                   else np.array(f.get(n), np.float32)) for n in f.keys()}
    out = {}
    for name, t in raw.items():
        if name.endswith("_scale_inv"):
            continue
        if name + "_scale_inv" in raw:
            s = raw[name + "_scale_inv"]
            full = s.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:t.shape[0], :t.shape[1]]
            t = t.view(torch.float8_e4m3fn).float() * full
        out[name] = t.numpy()
    return out


def dequantized_twin(src, fp8, dst):
    """``src`` with its weights replaced by the FP8 folder's, dequantized in torch, in f32."""
    dst.mkdir()
    for f in src.iterdir():
        if not f.name.endswith((".safetensors", ".index.json")):
            (dst / f.name).write_bytes(f.read_bytes())
    save_safetensors(dst / "model.safetensors", torch_dequantize(fp8), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Tiny bf16 checkpoints as the hub has them: Qwen3 with an untied lm_head (as Qwen3-8B), Llama."""
    root = tmp_path_factory.mktemp("fp8src")
    return {"qwen3": make_model("qwen3", root / "qwen3", seed=3, dtype="bfloat16", tie_word_embeddings=False),
            "llama": make_model("llama", root / "llama", seed=4, dtype="bfloat16"),
            # three layers, the middle one dense (mlp_only_layers), 8 experts: per-expert tensors, as the hub's
            "qwen3_moe": make_model("qwen3_moe", root / "qwen3_moe", seed=5, dtype="bfloat16"),
            "qwen3_vl": make_qwen3_vl(root / "qwen3_vl", seed=6)}


# -- the numbers ---------------------------------------------------------------------------------------------


def test_e4m3_encoder_is_torchs_cast_bit_for_bit():
    rng = np.random.default_rng(0)
    values = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    grid = np.unique(values[np.isfinite(values)])
    ties = (grid[1:] + grid[:-1]) / 2  # exactly halfway between neighbours (subnormals included)
    x = np.concatenate([
        grid, ties, np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf)),
        *(rng.standard_normal(200_000).astype(np.float32) * s for s in (2.0**-12, 2.0**-8, 1e-2, 1.0, 40.0, 400.0)),
        rng.uniform(-2.0**-6, 2.0**-6, 100_000).astype(np.float32),  # e4m3's subnormal range
        np.array([1e-45, -1e-45, 1e-40, 2.0**-10, 2.0**-9 * 0.5, 447.9, 448.0, 449.0, 463.99, 464.0, 464.01, 480.0,
                  1e6, 3e38, np.inf, -np.inf, -0.0, 0.0, -448.0, -500.0], np.float32),
    ]).astype(np.float32)
    got = encode_e4m3(x)
    want = torch_codes(x)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, list(zip(x[bad[:8]], got[bad[:8]], want[bad[:8]]))
    # NaN keeps its sign and is e4m3's NaN code, as torch's
    nan = np.array([np.nan, -np.nan], np.float32)
    assert (encode_e4m3(nan) == torch_codes(nan)).all() and set(encode_e4m3(nan)) == {0x7F, 0xFF}
    # and ml_dtypes agrees on everything that does not need saturating
    finite = x[np.abs(x) <= 448]
    assert (got[np.abs(x) <= 448] == finite.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)).all()


@pytest.mark.parametrize("shape, block", [((200, 300), (128, 128)), ((64, 80), (128, 128)), ((96, 64), (32, 48))])
def test_block_quantization_equals_torch_reference(shape, block):
    rng = np.random.default_rng(1)
    w = (rng.standard_normal(shape) * np.exp(rng.uniform(-6, 3, (shape[0], 1)))).astype(ml_dtypes.bfloat16)
    w[:block[0], :block[1]] = 0  # an all-zero block: scale 1, codes 0
    q, scale = quantize_block_fp8(w, block)
    ref_q, ref_scale = torch_quantize(w, block)
    assert q.dtype == ml_dtypes.float8_e4m3fn and q.shape == shape
    assert scale.dtype == np.float32 and scale.shape == (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    np.testing.assert_array_equal(scale, ref_scale)
    np.testing.assert_array_equal(q.view(np.uint8), ref_q)
    assert scale[0, 0] == 1.0 and not q[:block[0], :block[1]].view(np.uint8).any()


def test_block_quantization_agrees_with_transformers_quantizer():
    """transformers' FineGrainedFP8 quantizer (Fp8Quantize) multiplies by 448 / amax where we divide
    by amax / 448: the scales agree to an f32 ulp, the codes but for a rare neighbouring code."""
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    rng = np.random.default_rng(2)
    w = rng.standard_normal((256, 384)).astype(np.float32) * 0.02
    hf = Fp8Quantize(SimpleNamespace(quantization_config=transformers.FineGrainedFP8Config(
        weight_block_size=(128, 128))))._quantize_one("x.weight", torch.from_numpy(w))
    q, scale = quantize_block_fp8(w, (128, 128))
    np.testing.assert_allclose(scale, hf["x.weight_scale_inv"].numpy(), rtol=2e-7, atol=0)
    codes, hf_codes = q.view(np.uint8).astype(int), hf["x.weight"].view(torch.uint8).numpy().astype(int)
    assert np.abs(codes - hf_codes).max() <= 1 and (codes == hf_codes).mean() > 0.999


def test_round_trip_error_within_e4m3s_half_ulp():
    """bf16 weights of very different magnitudes per block: dequantized, each block's error is at most
    2^-4 of its largest value, and each value in e4m3's normal range within 2^-4 of itself."""
    rng = np.random.default_rng(3)
    block = (128, 128)
    magnitudes = np.exp(rng.uniform(-12, 4, (3, 1, 4, 1)))
    w = (rng.standard_normal((3, 128, 4, 128)) * magnitudes).reshape(384, 512).astype(ml_dtypes.bfloat16)
    w = w[:330, :450]  # partial blocks at the ends
    q, scale = quantize_block_fp8(w, block)
    full = np.repeat(np.repeat(scale, 128, 0), 128, 1)[:330, :450]
    back = q.astype(np.float32) * full
    w32 = w.astype(np.float32)
    err = np.abs(back - w32)
    for r in range(0, 330, 128):
        for c in range(0, 450, 128):
            blk = (slice(r, r + 128), slice(c, c + 128))
            assert err[blk].max() <= 2.0**-4 * np.abs(w32[blk]).max()
    normal = np.abs(w32) >= full * 2.0**-6
    assert (err[normal] <= 2.0**-4 * np.abs(w32[normal])).all()
    assert np.isclose(np.abs(back).max(), np.abs(w32).max(), rtol=0)  # each block's amax is exact (448 * scale)


# -- the folder ----------------------------------------------------------------------------------------------


def test_layout_is_the_qwen3_fp8_releases(sources, tmp_path):
    src = sources["qwen3"]
    out = quantize_to_fp8(src, tmp_path / "fp8", warn=lambda m: None)
    cfg, src_cfg = (json.loads((p / "config.json").read_text()) for p in (out, src))
    assert cfg["quantization_config"] == RELEASE_QC
    assert {k: v for k, v in cfg.items() if k != "quantization_config"} == src_cfg  # the rest as the source has it
    with SafetensorsFile(src / "model.safetensors") as f:
        source = {n: (f.info(n).dtype, f.info(n).shape) for n in f.keys()}
    with SafetensorsFile(out / "model.safetensors") as f:
        got = {n: (f.info(n).dtype, f.info(n).shape) for n in f.keys()}
        assert f.metadata == {"format": "pt"}
    linears = [n for n in source if LINEAR.fullmatch(n)]
    assert len(linears) == 7 * 2  # q, k, v, o, gate, up, down in each of the two layers
    want = dict(source)
    for n in linears:
        rows, cols = source[n][1]
        want[n] = ("F8_E4M3", (rows, cols))
        want[n + "_scale_inv"] = ("F32", (-(-rows // 128), -(-cols // 128)))
    assert got == want  # embeddings, lm_head, norms: BF16 as in the source; nothing else added
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
            "model.layers.0.self_attn.q_norm.weight"} <= {n for n, (d, _) in got.items() if d == "BF16"}
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (src / name).read_bytes()
    assert sorted(p.name for p in out.parent.iterdir()) == ["fp8"]  # no temp folder left


def _layout(path) -> dict[str, tuple[str, tuple]]:
    index = path / "model.safetensors.index.json"
    with open_safetensors(index if index.is_file() else path / "model.safetensors") as f:
        return {n: (f.info(n).dtype, tuple(f.info(n).shape)) for n in f.keys()}


def test_moe_layout_is_the_qwen3_moe_fp8_release(sources, tmp_path):
    """Qwen3-30B-A3B-FP8's layout: each expert's gate / up / down_proj FP8 with its own scale
    grid, the dense layer's MLP and the attention too; the routers (mlp.gate), norms, embeddings
    and lm_head as the source has them; modules_to_not_convert as the release's config lists it
    (lm_head, then per layer input_layernorm, mlp.gate, post_attention_layernorm)."""
    src = sources["qwen3_moe"]
    out = quantize_to_fp8(src, tmp_path / "fp8", warn=lambda m: None)
    cfg, src_cfg = (json.loads((p / "config.json").read_text()) for p in (out, src))
    layers, dense = src_cfg["num_hidden_layers"], set(src_cfg["mlp_only_layers"])
    assert cfg["quantization_config"] == {**RELEASE_QC, "modules_to_not_convert": ["lm_head", *(
        f"model.layers.{i}.{m}" for i in range(layers)
        for m in ("input_layernorm", "mlp.gate", "post_attention_layernorm") if not (m == "mlp.gate" and i in dense))]}
    assert {k: v for k, v in cfg.items() if k != "quantization_config"} == src_cfg
    source, got = _layout(src), _layout(out)
    linears = [n for n in source if MOE_LINEAR.fullmatch(n)]
    experts = src_cfg.get("num_experts", src_cfg.get("num_local_experts"))  # the hub's name, transformers 5's
    assert len(linears) == 4 * layers + 3 * experts * (layers - len(dense)) + 3 * len(dense)
    want = dict(source)
    for n in linears:
        rows, cols = source[n][1]
        want[n] = ("F8_E4M3", (rows, cols))
        want[n + "_scale_inv"] = ("F32", (-(-rows // 128), -(-cols // 128)))
    assert got == want
    assert got["model.layers.0.mlp.gate.weight"] == ("BF16", (experts, src_cfg["hidden_size"]))
    assert got["model.layers.0.mlp.experts.7.down_proj.weight"][0] == "F8_E4M3"


def test_a_stacked_experts_source_is_written_per_expert(sources, tmp_path):
    """transformers 5's stacked experts (mlp.experts.gate_up_proj [E, 2F, C], down_proj [E, C, F]:
    what a full fine-tune's export holds) give the per-expert folder of the hub's layout, byte for byte."""
    import shutil

    src = sources["qwen3_moe"]
    stacked = tmp_path / "stacked"
    shutil.copytree(src, stacked)
    with SafetensorsFile(src / "model.safetensors") as f:
        tensors = {n: np.array(f.get(n)) for n in f.keys()}
    E = sum(1 for n in tensors if n.startswith("model.layers.0.mlp.experts.") and n.endswith(".down_proj.weight"))
    for i in (0, 2):  # the sparse layers
        L = f"model.layers.{i}.mlp.experts."
        tensors[L + "gate_up_proj"] = np.stack([np.concatenate([tensors.pop(f"{L}{e}.gate_proj.weight"),
                                                                tensors.pop(f"{L}{e}.up_proj.weight")]) for e in range(E)])
        tensors[L + "down_proj"] = np.stack([tensors.pop(f"{L}{e}.down_proj.weight") for e in range(E)])
    save_safetensors(stacked / "model.safetensors", tensors, metadata={"format": "pt"})
    a = quantize_to_fp8(src, tmp_path / "a", block=(32, 32))
    b = quantize_to_fp8(stacked, tmp_path / "b", block=(32, 32))
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "config.json").read_bytes() == (b / "config.json").read_bytes()


def test_vision_layout_keeps_the_tower_and_transformers_loads_it(sources, tmp_path):
    """Qwen3-VL as Qwen's and RedHat's FP8 VL releases: the language model's projections FP8, the
    whole tower (patch conv, position grid, blocks, merger, DeepStack mergers) bit for bit the
    source's and named in modules_to_not_convert; transformers' Qwen3VLForConditionalGeneration
    loads it on the CPU and its logits on an image prompt equal ours (f32, 1e-4)."""
    src = sources["qwen3_vl"]
    out = quantize_to_fp8(src, tmp_path / "fp8", block=(32, 32))
    source, got = _layout(src), _layout(out)
    fp8 = {n for n, (d, _) in got.items() if d == "F8_E4M3"}
    text = re.compile(r"model\.language_model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight")
    assert fp8 == {n for n in source if text.fullmatch(n)} and len(fp8) == 7 * 2
    tower = [n for n in source if n.startswith("model.visual.")]
    assert tower and all(got[n] == source[n] for n in tower)
    with open_safetensors(src / "model.safetensors") as f, open_safetensors(out / "model.safetensors") as g:
        assert all(np.array_equal(f.get(n), g.get(n)) for n in tower)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["modules_to_not_convert"] == ["lm_head", *dict.fromkeys(n.rsplit(".", 1)[0] for n in sorted(
        tower, key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)]))]
    assert "model.visual.merger.linear_fc1" in qc["modules_to_not_convert"]
    hf = transformers.Qwen3VLForConditionalGeneration.from_pretrained(str(out), dtype=torch.float32).eval()
    (ids, images), _ = qwen3_vl_prompts(seed=3)
    np.testing.assert_allclose(surogate.load_model(out).forward(ids, images=images),
                               qwen3_vl_hf_logits(hf, ids, images=images), atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen3_moe"])
@pytest.mark.parametrize("block", [(128, 128), (32, 48)])  # tiny dims < 128: every block partial; 48: some
def test_export_loads_with_the_logits_of_its_dequantized_twin(sources, tmp_path, family, block):
    src = sources[family]
    out = quantize_to_fp8(src, tmp_path / "fp8", block=block, warn=lambda m: None)
    twin = dequantized_twin(src, out, tmp_path / "twin")
    ids = np.random.default_rng(5).integers(0, 200, 19)
    ours = surogate.load_model(out).forward(ids)
    np.testing.assert_allclose(ours, surogate.load_model(twin).forward(ids), atol=1e-5, rtol=0)
    # and the FP8 model is near the bf16 original (e4m3's few bits are all that changed)
    orig = surogate.load_model(src).forward(ids)
    assert np.abs(ours - orig).max() < 0.1 * np.abs(orig).max()


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen3_moe"])
def test_transformers_loads_the_export(sources, tmp_path, family):
    """transformers 5 on the CPU loads an fp8 checkpoint dequantized (FineGrainedFP8Config's dequantize,
    set by itself without a GPU). Its CPU dequantize takes the block from the scale grid, so it needs
    whole blocks: 32 x 32 here (the tiny dims are multiples of 32; vLLM's GPU path takes partial ones)."""
    src = sources[family]
    out = quantize_to_fp8(src, tmp_path / "fp8", block=(32, 32))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    twin = torch_dequantize(out)
    state = hf.state_dict()
    for name in ("model.layers.1.mlp.down_proj.weight", "model.layers.0.self_attn.k_proj.weight"):
        np.testing.assert_array_equal(state[name].float().numpy(), twin[name])
    ids = np.random.default_rng(6).integers(0, 200, 17)
    with torch.no_grad():
        want = hf(torch.tensor(ids)[None]).logits[0].float().numpy()
    np.testing.assert_allclose(surogate.load_model(out).forward(ids), want, atol=1e-4, rtol=0)


def test_big_models_are_sharded_with_an_index(sources, tmp_path):
    src = sources["llama"]
    single = quantize_to_fp8(src, tmp_path / "one", block=(32, 32))
    # the same weights from a sharded source (same seed), written as shards
    src_shards = make_model("llama", tmp_path / "src-shards", seed=4, dtype="bfloat16", max_shard_size="60KB")
    assert (src_shards / "model.safetensors.index.json").is_file()
    sharded = quantize_to_fp8(src_shards, tmp_path / "sharded", block=(32, 32), shard_bytes=40_000)
    shards = sorted(p.name for p in sharded.glob("*.safetensors"))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    with SafetensorsFile(single / "model.safetensors") as f:
        names, total = set(f.keys()), sum(f.info(n).nbytes for n in f.keys())
    assert set(index["weight_map"]) == names and index["metadata"]["total_size"] == total
    assert set(index["weight_map"].values()) == set(shards)
    a, b = torch_dequantize(single), torch_dequantize(sharded)
    assert all(np.array_equal(a[n], b[n]) for n in a)
    ids = np.arange(12)
    np.testing.assert_array_equal(surogate.load_model(sharded).forward(ids), surogate.load_model(single).forward(ids))


def test_uneven_blocks_warn_of_vllms_rule(sources, tmp_path):
    said = []
    quantize_to_fp8(sources["llama"], tmp_path / "fp8", warn=said.append)  # 128 x 128 over 32..128-wide weights
    # (q, k, v rows of 64, 32, 32 in each layer; gate / up rows of 128 are whole)
    assert said == ["14 FP8 weights are not whole 128x128 blocks (e.g. model.layers.0.self_attn.k_proj.weight "
                    "[32, 64]): surogate reads them; vLLM refuses 6 of them (fused q/k/v or gate/up rows must be whole blocks); "
                    "transformers' CPU dequantize needs whole blocks"]
    said.clear()
    quantize_to_fp8(sources["llama"], tmp_path / "fp8c", block=(32, 48), warn=said.append)  # rows whole, columns not
    assert len(said) == 1 and "vLLM reads them on one GPU" in said[0]
    said.clear()
    quantize_to_fp8(sources["llama"], tmp_path / "fp8b", block=(32, 32), warn=said.append)
    assert said == []


# -- refusals ------------------------------------------------------------------------------------------------


def test_requantizing_is_refused(sources, tmp_path):
    out = quantize_to_fp8(sources["llama"], tmp_path / "fp8", block=(32, 32))
    with pytest.raises(UnsupportedError, match=r"quantized already \(quantization_config quant_method 'fp8'\)"):
        quantize_to_fp8(out, tmp_path / "again")
    # FP8 tensors without a quantization_config are refused too
    cfg = json.loads((out / "config.json").read_text())
    del cfg["quantization_config"]
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedError, match="is F8_E4M3 already"):
        quantize_to_fp8(out, tmp_path / "again")
    assert not (tmp_path / "again").exists()


def test_gguf_and_unmapped_families_and_the_source_itself_are_refused(sources, tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(UnsupportedError, match="is a file; --type FP8 reads a Hugging Face model folder"):
        quantize_to_fp8(gguf, tmp_path / "out")
    gemma = make_model("gemma3", tmp_path / "gemma", seed=1)
    with pytest.raises(UnsupportedError, match="the gemma3 family is not written as block FP8") as e:
        quantize_to_fp8(gemma, tmp_path / "out")
    assert all(f in e.value.hint for f in ("llama", "qwen3", "qwen3_moe", "qwen3_vl"))
    # Qwen3-VL-MoE: Qwen's release stores its experts per expert, which transformers' qwen3_vl_moe
    # loader does not read (it takes the stacked tensors only), so no layout is written
    vl_moe = make_qwen3_vl(tmp_path / "vl_moe", moe=True, seed=1)
    with pytest.raises(UnsupportedError, match="the qwen3_vl_moe family is not written as block FP8"):
        quantize_to_fp8(vl_moe, tmp_path / "out")
    with pytest.raises(InvalidArgumentError, match="is the source folder"):
        quantize_to_fp8(sources["llama"], sources["llama"])
    with pytest.raises(InvalidArgumentError, match="is not two positive integers"):
        quantize_to_fp8(sources["llama"], tmp_path / "out", block=(128, 0))
    # a 2-D tensor that is not one of the family's projections (nor an embedding / lm_head)
    odd = make_model("llama", tmp_path / "odd", seed=2)
    with SafetensorsFile(odd / "model.safetensors") as f:
        tensors = {n: np.array(f.get(n)) for n in f.keys()}
    save_safetensors(odd / "model.safetensors", {**tensors, "model.layers.0.mlp.extra.weight": np.ones((4, 4))})
    with pytest.raises(UnsupportedError, match=r"model.layers.0.mlp.extra.weight \[4, 4\] is neither a projection"):
        quantize_to_fp8(odd, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# -- the commands --------------------------------------------------------------------------------------------


def test_surogate_quantize_type_fp8(sources, tmp_path):
    out = tmp_path / "qwen3-fp8"
    proc = subprocess.run([sys.executable, "-P", "-m", "surogate.cli.main", "quantize", str(sources["qwen3"]),
                           "--type", "fp8", "-o", str(out)], check=False, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {out} (FP8, ")
    progress = [line for line in proc.stderr.splitlines() if line.startswith("[")]
    with SafetensorsFile(sources["qwen3"] / "model.safetensors") as f:
        assert len(progress) == len(f.keys())
    assert any("FP8   model.layers.0.self_attn.q_proj.weight [64, 64]" in line for line in progress)
    assert "warning:" in proc.stderr  # the tiny dims are not whole 128 blocks
    assert json.loads((out / "config.json").read_text())["quantization_config"] == RELEASE_QC


def test_surogate_merge_type_fp8_is_merge_then_quantize(sources, tmp_path):
    from typer.testing import CliRunner

    from surogate.cli.main import app
    from surogate.dsl.nn import LoRAConfig
    from surogate.train.export import merge_adapter
    from surogate.train.lora import init_lora, save_peft_adapter

    src = sources["llama"]
    model = surogate.load_model(src)
    lora = LoRAConfig(rank=4, alpha=8, targets=("q_proj", "v_proj", "down_proj"))
    exe = model.executable("train", 8, 1, lora=lora, grads=True)
    adapter = save_peft_adapter(tmp_path / "adapter", {k: v + 0.01 for k, v in init_lora(exe.graph, 0).items()},
                                lora, base_model=str(src))
    result = CliRunner().invoke(app, ["merge", "--adapter", str(adapter), "--output", str(tmp_path / "m-fp8"),
                                      "--type", "FP8"])
    assert result.exit_code == 0, result.output
    assert "warning: 14 FP8 weights are not whole 128x128 blocks" in result.output
    step_by_step = quantize_to_fp8(merge_adapter(None, adapter, tmp_path / "merged"), tmp_path / "q", warn=print)
    a, b = torch_dequantize(tmp_path / "m-fp8"), torch_dequantize(step_by_step)
    assert a.keys() == b.keys() and all(np.array_equal(a[n], b[n]) for n in a)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "m-fp8", "merged", "q"]  # no temp left


def test_merge_type_fp8_of_a_moe_adapter(sources, tmp_path):
    """A LoRA on the attention and the experts (peft's target_parameters) merged into Qwen3-MoE and
    written as FP8: the per-expert folder of merge-then-quantize, and transformers reads it as we do."""
    from surogate.dsl.nn import LoRAConfig
    from surogate.train.export import merge_adapter
    from surogate.train.lora import init_lora, save_peft_adapter

    src = sources["qwen3_moe"]
    model = surogate.load_model(src)
    lora = LoRAConfig(rank=4, alpha=8, targets=("q_proj", "gate_proj", "up_proj", "down_proj"))
    exe = model.executable("train", 8, 1, lora=lora, grads=True)
    adapter = save_peft_adapter(tmp_path / "adapter", {k: v + 0.01 for k, v in init_lora(exe.graph, 0).items()},
                                lora, base_model=str(src))
    merged = merge_adapter(None, adapter, tmp_path / "m-fp8", quantize="FP8", warn=lambda m: None)
    step_by_step = quantize_to_fp8(merge_adapter(None, adapter, tmp_path / "merged"), tmp_path / "q",
                                   warn=lambda m: None)
    a, b = torch_dequantize(merged), torch_dequantize(step_by_step)
    assert a.keys() == b.keys() and all(np.array_equal(a[n], b[n]) for n in a)
    assert "model.layers.0.mlp.experts.3.gate_proj.weight_scale_inv" in _layout(merged)
    base = torch_dequantize(quantize_to_fp8(src, tmp_path / "base", warn=lambda m: None))
    assert not np.array_equal(a["model.layers.0.mlp.experts.3.down_proj.weight"],
                              base["model.layers.0.mlp.experts.3.down_proj.weight"])  # the experts' LoRA is in
