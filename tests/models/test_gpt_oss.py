"""GPT-OSS beyond the registry-driven tests, on a tiny checkpoint whose sinks, router bias and
expert biases are far from transformers' init (zeros / 0.02) and whose experts are scaled so that
the SwiGLU clamps (gate > 7, |up| > 7) are reached: logits, loss and every gradient against
transformers; LoRA on attention and on the stacked experts (peft's target_parameters) against
peft, the adapter loaded back by peft and merged; greedy serving against generate; MXFP4
checkpoints dequantized as transformers does; YaRN rope on another family (Qwen3)."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import surogate  # noqa: E402
from sgtest.peft_ref import peft_model  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402


def _hf(path):
    return transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _spread(path, seed=0, scale=60.0):
    """Rewrite the checkpoint with large sinks, router and expert biases, experts times `scale`."""
    m = _hf(path)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.sinks.copy_(torch.randn(layer.self_attn.sinks.shape, generator=gen) * 1.5)
            layer.mlp.router.bias.copy_(torch.randn(layer.mlp.router.bias.shape, generator=gen) * 0.5)
            ex = layer.mlp.experts
            ex.gate_up_proj.mul_(scale)
            ex.gate_up_proj_bias.copy_(torch.randn(ex.gate_up_proj_bias.shape, generator=gen) * 2.0)
            ex.down_proj_bias.copy_(torch.randn(ex.down_proj_bias.shape, generator=gen) * 0.3)
    m.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return _spread(make_model("gpt_oss", tmp_path_factory.mktemp("gpt_oss"), seed=5))


def _ids(vocab, n, seed):
    return np.random.default_rng(seed).integers(0, vocab, n)


def _close(got, want, name, tol=1e-4):
    err = np.abs(got - want).max() / (np.abs(want).max() + 1e-12)
    assert err < tol, f"{name}: {err:.2e}"


def test_clamps_sinks_and_biases_are_exercised(folder):
    """The checkpoint really reaches the clamps (else the test below could not see them)."""
    ref = _hf(folder)
    seen = []
    ex = ref.model.layers[0].mlp.experts
    hook = ex.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach()))
    ids = _ids(ref.config.vocab_size, 31, 1)
    with torch.no_grad():
        ref(torch.tensor(ids)[None])
    hook.remove()
    h = seen[0]
    gu = torch.einsum("nc,ecf->enf", h, ex.gate_up_proj) + ex.gate_up_proj_bias[:, None]
    gate, up = gu[..., ::2], gu[..., 1::2]
    assert (gate > 7).float().mean() > 0.01 and (up.abs() > 7).float().mean() > 0.01
    assert ref.model.layers[0].self_attn.sinks.abs().max() > 1.0


def test_logits_loss_and_grads_match_transformers(folder):
    ours = surogate.load_model(folder)
    ref = _hf(folder)
    ids = _ids(ours.spec.vocab_size, 29, 2)
    t = torch.tensor(ids)[None]
    out = ref(t, labels=t)
    np.testing.assert_allclose(ours.forward(ids), out.logits[0].detach().numpy(), atol=2e-4, rtol=0)
    loss, grads = ours.loss_and_grads(ids)
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    out.loss.backward()
    ref_grads = {n: p.grad.numpy() for n, p in ref.named_parameters()}
    hf = ours.to_hf(grads)
    assert set(hf) == set(ref_grads)
    for name in ("self_attn.sinks", "mlp.router.bias", "mlp.experts.gate_up_proj_bias", "self_attn.o_proj.bias"):
        assert any(n.endswith(name) for n in hf), name
    for name, g in hf.items():
        _close(g, ref_grads[name], name)


def test_aux_loss_equals_transformers(tmp_path):
    path = _spread(make_model("gpt_oss", tmp_path / "m", seed=2, num_local_experts=8, num_experts_per_tok=2,
                              output_router_logits=True, router_aux_loss_coef=0.05))
    ours = surogate.load_model(path)
    ids = _ids(ours.spec.vocab_size, 25, 3)
    loss, _ = ours.loss_and_grads(ids)
    exe = ours.executable("train", len(ids), 1, grads=True)
    out = _hf(path)(torch.tensor(ids)[None], labels=torch.tensor(ids)[None])
    assert float(exe.read("aux_loss")[0]) == pytest.approx(out.aux_loss.item(), rel=1e-5)
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)


# ---- LoRA: attention (target_modules) and experts (target_parameters) ----------------------
ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def _peft_model(folder, seed=0):
    pytest.importorskip("peft")
    return peft_model(_hf(folder), ATTN, seed=seed, target_parameters=EXPERTS)


def _named(pm, cfg, attr):
    from surogate.models.peft import from_peft_tensors

    return from_peft_tensors({n.replace(".default", ""): getattr(p, attr).numpy().copy()
                              for n, p in pm.named_parameters() if "lora_" in n}, cfg)


def test_lora_on_attention_and_experts_matches_peft(folder, tmp_path):
    from surogate.models.peft import load_peft_adapter

    pm = _peft_model(folder)
    pm.save_pretrained(str(tmp_path / "adapter"))
    cfg, params = load_peft_adapter(tmp_path / "adapter")
    assert {"gate_up_proj", "down_proj"} <= set(cfg.targets)
    ours = surogate.load_model(folder)
    ids = _ids(ours.spec.vocab_size, 23, 4)
    loss, grads = ours.loss_and_grads(ids, lora=cfg, lora_params=params)
    t = torch.tensor(ids)[None]
    out = pm(input_ids=t, labels=t)
    out.loss.backward()
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    ref = _named(pm, cfg, "grad")
    assert set(grads) == set(ref) and any(".mlp.experts." in n for n in grads)
    for name, g in grads.items():
        _close(g, ref[name], name)


def test_our_adapter_loads_in_peft_and_merges(folder, tmp_path):
    peft = pytest.importorskip("peft")
    from surogate.train.export import merge_adapter
    from surogate.train.lora import init_lora, save_peft_adapter

    ours = surogate.load_model(folder)
    cfg = LoRAConfig(rank=4, alpha=8, targets=tuple(ATTN) + ("gate_up_proj", "down_proj"))
    g = ours.arch.build(mode="logits", dtype="float32", lora=cfg)
    rng = np.random.default_rng(7)
    params = {k: (v if k.endswith("lora_A") else rng.standard_normal(v.shape).astype(np.float32) * 0.3)
              for k, v in init_lora(g, 7).items()}
    adapter = save_peft_adapter(tmp_path / "adapter", params, cfg, base_model=str(folder))
    meta = json.loads((adapter / "adapter_config.json").read_text())
    assert sorted(meta["target_parameters"]) == ["down_proj", "gate_up_proj"]
    ids = _ids(ours.spec.vocab_size, 21, 5)
    exe = ours.executable("logits", len(ids), 1, lora=cfg)
    ours._feed(exe, *surogate.model.pack(ids), params)
    exe.run()
    got = np.array(exe.read("logits"))
    tuned = peft.PeftModel.from_pretrained(_hf(folder), str(adapter)).eval()
    with torch.no_grad():
        want = tuned(torch.tensor(ids)[None]).logits[0].numpy()
    _close(got, want, "logits with the adapter")
    merged = merge_adapter(folder, adapter, tmp_path / "merged")
    with torch.no_grad():
        again = _hf(merged)(torch.tensor(ids)[None]).logits[0].numpy()
        plain = _hf(folder)(torch.tensor(ids)[None]).logits[0].numpy()
    _close(again, want, "merged logits")
    assert np.abs(plain - want).max() > 1e-2


def test_serving_greedy_equals_generate(folder):
    from sgtest.engine import engine, generate, hf_greedy

    ours = surogate.load_model(folder)
    ref = _hf(folder)
    rng = np.random.default_rng(9)
    ps = [rng.integers(3, ours.spec.vocab_size, n).tolist() for n in (3, 12, 27)]  # past the window of 8
    want = [hf_greedy(ref, p, 8) for p in ps]
    with engine(ours, num_blocks=32, block_size=4) as client:
        assert generate(client, ps, 8) == want


# ---- MXFP4 checkpoints ------------------------------------------------------------------
def test_mxfp4_dequantize_equals_transformers():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from surogate.io.quantized_checkpoint import dequantize_mxfp4

    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (3, 10, 4, 16), dtype=np.uint8)
    scales = rng.integers(100, 150, (3, 10, 4), dtype=np.uint8)
    want = convert_moe_packed_tensors(torch.tensor(blocks), torch.tensor(scales), dtype=torch.float32).numpy()
    got = dequantize_mxfp4(blocks, scales, "test")
    assert got.shape == want.shape == (3, 128, 10)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_mxfp4_checkpoint_loads_as_its_dequantized_weights(folder, tmp_path):
    """OpenAI's layout: experts as *_blocks / *_scales with quantization_config mxfp4; the model
    equals transformers on the same weights dequantized by transformers' own function."""
    import shutil

    from safetensors.numpy import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    src = load_file(str(folder / "model.safetensors"))
    rng = np.random.default_rng(1)
    packed, plain = {}, {}
    for name, a in src.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            E, cin, cout = a.shape
            blocks = rng.integers(0, 256, (E, cout, cin // 32, 16), dtype=np.uint8)
            scales = rng.integers(118, 124, (E, cout, cin // 32), dtype=np.uint8)
            packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
            plain[name] = convert_moe_packed_tensors(torch.tensor(blocks), torch.tensor(scales),
                                                     dtype=torch.float32).numpy()
        else:
            packed[name] = plain[name] = a
    q, d = tmp_path / "mxfp4", tmp_path / "dequantized"
    for out, tensors in ((q, packed), (d, plain)):
        shutil.copytree(folder, out)
        save_file(tensors, str(out / "model.safetensors"))
    cfg = json.loads((q / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (q / "config.json").write_text(json.dumps(cfg))
    ids = _ids(surogate.load_model(d).spec.vocab_size, 19, 6)
    got = surogate.load_model(q).forward(ids)
    with torch.no_grad():
        want = _hf(d)(torch.tensor(ids)[None]).logits[0].numpy()
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)


# ---- YaRN for other families ------------------------------------------------------------
@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_rope_on_qwen3_matches_transformers(tmp_path, truncate):
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 10000.0,
            "beta_fast": 8.0, "truncate": truncate}
    path = make_model("qwen3", tmp_path / "q", seed=1, rope_parameters=rope, max_position_embeddings=128)
    ours = surogate.load_model(path)
    assert ours.spec.rope["rope_type"] == "yarn" and ours.spec.rope["attention_factor"] > 1
    ids = _ids(ours.spec.vocab_size, 90, 7)
    with torch.no_grad():
        want = _hf(path)(torch.tensor(ids)[None]).logits[0].numpy()
    np.testing.assert_allclose(ours.forward(ids), want, atol=1e-4, rtol=0)


# ---- GGUF: llama.cpp's gpt-oss, experts as MXFP4 -----------------------------------------
def _mxfp4_folder(folder, out):
    """``folder`` with its experts replaced by random MXFP4 blocks (OpenAI's layout)."""
    import shutil

    from safetensors.numpy import load_file, save_file

    src = load_file(str(folder / "model.safetensors"))
    rng = np.random.default_rng(1)
    packed = {}
    for name, a in src.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            E, cin, cout = a.shape
            packed[name + "_blocks"] = rng.integers(0, 256, (E, cout, cin // 32, 16), dtype=np.uint8)
            packed[name + "_scales"] = rng.integers(118, 124, (E, cout, cin // 32), dtype=np.uint8)
        else:
            packed[name] = a
    shutil.copytree(folder, out)
    save_file(packed, str(out / "model.safetensors"))
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4"}
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_gguf_of_an_mxfp4_checkpoint_is_llama_cpps_gpt_oss(folder, tmp_path):
    """`surogate quantize` of OpenAI's layout: architecture gpt-oss, llama.cpp's tensor names
    (gguf-py's MODEL_TENSORS[GPT_OSS]), the experts MXFP4 whose gguf-py dequantization is the
    checkpoint's exactly (gate / up de-interleaved, transposed), and the file loads back as the model."""
    gguf = pytest.importorskip("gguf")
    from gguf.constants import MODEL_ARCH, MODEL_TENSORS, TENSOR_NAMES, GGMLQuantizationType

    from surogate.io.quantized_checkpoint import MXFP4Weights
    from surogate.io.safetensors import SafetensorsFile
    from surogate.models.gguf_names import quantize_to_gguf

    src = _mxfp4_folder(folder, tmp_path / "mxfp4")
    out = quantize_to_gguf(src, tmp_path / "m.gguf", "F32")
    reader = gguf.GGUFReader(str(out))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    assert arch == "gpt-oss"
    allowed = {TENSOR_NAMES[t].format(bid=i) + s for t in MODEL_TENSORS[MODEL_ARCH.GPT_OSS] for i in range(2)
               for s in (".weight", ".bias")}
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) <= allowed
    w = MXFP4Weights(SafetensorsFile(src / "model.safetensors"), "test")
    for i in range(2):
        gu = w.get(f"model.layers.{i}.mlp.experts.gate_up_proj")  # [E, C, 2F]
        down = w.get(f"model.layers.{i}.mlp.experts.down_proj")   # [E, F, C]
        want = {"ffn_gate_exps": np.swapaxes(gu, 1, 2)[:, 0::2], "ffn_up_exps": np.swapaxes(gu, 1, 2)[:, 1::2],
                "ffn_down_exps": np.swapaxes(down, 1, 2)}
        for n, v in want.items():
            t = tensors[f"blk.{i}.{n}.weight"]
            assert t.tensor_type == GGMLQuantizationType.MXFP4
            got = gguf.quants.dequantize(t.data, t.tensor_type).reshape(v.shape)
            assert np.array_equal(got, v), n
    meta = {k: f.contents() for k, f in reader.fields.items() if k.startswith("gpt-oss.")}
    assert meta["gpt-oss.expert_count"] == 4 and meta["gpt-oss.attention.sliding_window"] == 8
    assert meta["gpt-oss.rope.scaling.type"] == "yarn"
    ids = _ids(surogate.load_model(src).spec.vocab_size, 19, 8)
    np.testing.assert_allclose(surogate.load_model(out).forward(ids), surogate.load_model(src).forward(ids),
                               atol=1e-5, rtol=0)


def test_bf16_agrees_with_f32_as_transformers_bf16_does(folder):
    """bf16 storage (the sinks, the clamped SwiGLU and the expert biases in bf16): our bf16 logits
    are no further from the f32 ones than transformers' bf16 model is from its f32 one (times 1.5),
    the loss to 1%."""
    f32 = surogate.load_model(folder)
    bf16 = surogate.load_model(folder, dtype="bfloat16")
    ids = _ids(f32.spec.vocab_size, 31, 9)
    a, b = f32.forward(ids), bf16.forward(ids)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).eval()
    with torch.no_grad():
        h = hf(torch.tensor(ids)[None]).logits[0].float().numpy()
    ours, theirs = np.abs(a - b).max(), np.abs(a - h).max()
    assert ours < 1.5 * theirs, (ours, theirs)
    assert bf16.loss(ids) == pytest.approx(f32.loss(ids), rel=1e-2)


def test_train_router_under_lora_is_refused(folder):
    import dataclasses

    from surogate.errors import UnsupportedError

    m = surogate.load_model(folder)
    spec = dataclasses.replace(m.spec, moe=dataclasses.replace(m.spec.moe, train_router=True))
    with pytest.raises(UnsupportedError, match="train_router with LoRA on gpt_oss"):
        m.family.architecture(spec).build(mode="train", lora=LoRAConfig(rank=4, alpha=8, targets=("q_proj",)))


def test_yarn_survives_a_qwen3_gguf(tmp_path):
    """YaRN on another family's GGUF: the rope.scaling.* keys written and read back to the same rope."""
    from surogate.models.gguf_names import quantize_to_gguf

    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 10000.0}
    path = make_model("qwen3", tmp_path / "q", seed=1, rope_parameters=rope, max_position_embeddings=128,
                      hidden_size=256, intermediate_size=512, head_dim=128, num_attention_heads=2,
                      num_key_value_heads=1)
    out = quantize_to_gguf(path, tmp_path / "q.gguf", "F32")
    a, b = surogate.load_model(path), surogate.load_model(out)
    assert b.spec.rope == a.spec.rope
    ids = _ids(a.spec.vocab_size, 60, 3)
    np.testing.assert_allclose(b.forward(ids), a.forward(ids), atol=1e-5, rtol=0)


def test_sft_with_expert_lora_trains_merges_and_loads_in_peft(folder, tmp_path):
    """`surogate sft` end to end on GPT-OSS: LoRA on attention and the experts (lora_target_modules
    with gate_up_proj / down_proj), 3 steps, the adapter loaded by peft gives the merged model's logits."""
    peft = pytest.importorskip("peft")
    from sgtest.qa import sft_config, step_losses, write_qa

    from surogate.train.trainer import Trainer

    data = write_qa(tmp_path / "qa.jsonl")
    cfg = sft_config(folder, data, tmp_path / "run", max_steps=3, merge_adapter=True, lora_rank=4, lora_alpha=8,
                     lora_dropout=0.0,
                     lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"])
    tr = Trainer(cfg)
    assert any(".mlp.experts.gate_up_proj.lora_A" in n for n in tr.trainable)
    result = tr.train()
    assert len(step_losses(tmp_path / "run")) == 3
    pm = peft.PeftModel.from_pretrained(_hf(folder), str(result.output)).eval()
    ids = np.arange(3, 40)
    with torch.no_grad():
        ref = pm(torch.tensor(ids)[None]).logits[0].numpy()
    got = surogate.load_model(result.merged).forward(ids)
    _close(got, ref, "merged logits vs peft")
    assert np.abs(got - surogate.load_model(folder).forward(ids)).max() > 1e-3
