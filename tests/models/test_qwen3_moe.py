"""Qwen3-MoE beyond the registry-driven tests: the router's load-balancing loss equals the
aux_loss transformers reports; LoRA on the attention projections and on the experts (peft 0.21's
target_parameters layout on transformers 5) equals peft's in gradients, files, merge and serving."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import surogate  # noqa: E402
from sgtest.peft_ref import check_lora_grads, peft_model, peft_tensors  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402
from surogate.train.lora import init_lora, save_peft_adapter  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_model("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe"), seed=5)


def test_aux_loss_equals_transformers_aux_loss(folder):
    ours = surogate.load_model(folder)
    ids = np.random.default_rng(3).integers(0, ours.spec.vocab_size, 29)
    loss, _ = ours.loss_and_grads(ids)
    exe = ours.executable("train", len(ids), 1, grads=True)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    t = torch.tensor(ids)[None]
    out = ref(t, labels=t)
    assert float(exe.read("aux_loss")[0]) == pytest.approx(out.aux_loss.item(), rel=1e-5)
    assert ours.spec.moe.router_aux_loss_coef == ref.config.router_aux_loss_coef > 0
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)


def test_attention_lora_on_a_moe_model_matches_peft(folder):
    pytest.importorskip("peft")
    ours = surogate.load_model(folder)
    check_lora_grads(ours, _peft_model(folder, ATTN), LoRAConfig(rank=4, alpha=8, targets=tuple(ATTN)),
                     np.random.default_rng(2).integers(0, ours.spec.vocab_size, 19))


# ---- LoRA on the experts: peft 0.21's layout on transformers 5 (target_parameters) ----------
ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERT_TARGETS = ["gate_proj", "up_proj", "down_proj"]


def _peft_model(folder, targets, **kw):
    """peft's model over the folder's transformers model, random (nonzero) B's."""
    pytest.importorskip("peft")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    return peft_model(ref, targets, **kw)


@pytest.mark.parametrize("targets", [ATTN + EXPERT_TARGETS, ["down_proj"], ["gate_proj", "up_proj"]])
def test_expert_lora_grads_match_peft(folder, targets):
    from surogate.models.peft import load_peft_adapter

    pm = _peft_model(folder, targets)
    pm.save_pretrained(str(folder.parent / "peft_adapter"))
    cfg, params = load_peft_adapter(folder.parent / "peft_adapter")
    assert cfg.targets  # its target_parameters (gate_up_proj with rank 2r) as our targets
    ours = surogate.load_model(folder)
    ids = np.random.default_rng(2).integers(0, ours.spec.vocab_size, 23)
    lora = LoRAConfig(rank=4, alpha=8, targets=tuple(targets))
    # The config we build from the user's targets and the one read back from peft's folder agree.
    g1 = ours.arch.build(mode="train", lora=lora)
    g2 = ours.arch.build(mode="train", lora=cfg)
    shapes = {p.name: p.shape for p in g1.params() if p.meta.get("lora")}
    assert shapes == {p.name: p.shape for p in g2.params() if p.meta.get("lora")} == \
        {n: a.shape for n, a in params.items()}
    grads = check_lora_grads(ours, pm, lora, ids, lora_params=params)
    assert any(".mlp.experts." in n for n in grads)


def _our_adapter(model, cfg, seed=7, train_router=False):
    """Our adapter tensors for cfg, B random (the adapter changes the outputs), and with
    train_router a router weight of each sparse layer moved off the base one."""
    g = model.arch.build(mode="logits", dtype="float32", lora=cfg)
    rng = np.random.default_rng(seed)
    params = {k: (v if k.endswith("lora_A") else rng.standard_normal(v.shape).astype(np.float32) * 0.3)
              for k, v in init_lora(g, seed).items()}
    if train_router:
        for i in model.spec.moe.layers:
            w = model.params[f"layers.{i}.mlp.gate.weight"]
            params[f"layers.{i}.mlp.gate.weight"] = w + rng.standard_normal(w.shape).astype(np.float32) * 0.2
    return params


def _hf_logits(m, ids):
    with torch.no_grad():
        return m(torch.tensor(ids)[None]).logits[0].numpy()


@pytest.mark.parametrize("train_router", [False, True])
def test_our_expert_adapter_loads_in_peft_and_merges(folder, tmp_path, train_router):
    """What the trainer writes (save_peft_adapter) is what peft loads: the same logits as our
    model with the adapter; `surogate merge` (merge_adapter) folds it into the per-expert
    checkpoint tensors, and transformers on the merged folder gives those logits again."""
    peft = pytest.importorskip("peft")
    from surogate.train.export import merge_adapter

    ours = surogate.load_model(folder)
    cfg = LoRAConfig(rank=4, alpha=8, targets=tuple(ATTN + EXPERT_TARGETS))
    params = _our_adapter(ours, cfg, train_router=train_router)
    adapter = save_peft_adapter(tmp_path / "adapter", params, cfg, base_model=str(folder))
    meta = json.loads((adapter / "adapter_config.json").read_text())
    assert sorted(meta["target_parameters"]) == ["down_proj", "gate_up_proj"]
    assert meta["rank_pattern"] == {r".*\.gate_up_proj": 8} and sorted(meta["target_modules"]) == sorted(ATTN)
    assert meta["modules_to_save"] == (["gate"] if train_router else None)
    ids = np.random.default_rng(4).integers(0, ours.spec.vocab_size, 21)
    exe = ours.executable("logits", len(ids), 1, lora=cfg)
    ours._feed(exe, *surogate.model.pack(ids), params)
    exe.run()
    got = np.array(exe.read("logits"))
    base = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    tuned = peft.PeftModel.from_pretrained(base, str(adapter)).eval()
    want = _hf_logits(tuned, ids)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4
    merged = merge_adapter(folder, adapter, tmp_path / "merged")
    hf_merged = transformers.AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32).eval()
    assert np.abs(_hf_logits(hf_merged, ids) - want).max() / np.abs(want).max() < 1e-4
    # The adapter does change the model (the comparison above is not base against base).
    plain = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    assert np.abs(_hf_logits(plain, ids) - want).max() > 1e-2


def test_expert_lora_in_serving_equals_peft_generate(folder, tmp_path):
    """Runtime LoRA per request: adapter requests through the engine give transformers + peft's
    greedy tokens, base requests in the same batch transformers' alone."""
    peft = pytest.importorskip("peft")
    from sgtest.engine import hf_greedy
    from surogate.serve.engine_client import EngineClient
    from surogate.serve.model_runner import ProgramRunner
    from surogate.serve.types import EngineConfig, SamplingParams
    from surogate.train.lora import load_peft_adapter

    ours = surogate.load_model(folder)
    cfg = LoRAConfig(rank=4, alpha=8, targets=tuple(ATTN + EXPERT_TARGETS))
    adapter = save_peft_adapter(tmp_path / "adapter", _our_adapter(ours, cfg, seed=3, train_router=True), cfg,
                                base_model=str(folder))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tuned = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32), str(adapter)).eval()
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 400, n).tolist() for n in (5, 19, 33)]
    want = [hf_greedy(ref, p, 6) for p in prompts] + [hf_greedy(tuned, p, 6) for p in prompts]
    assert want[:3] != want[3:]
    runner = ProgramRunner(ours, num_blocks=64, block_size=16)
    runner.add_adapter(0, *load_peft_adapter(adapter))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with EngineClient(runner, EngineConfig(num_blocks=64, block_size=16)) as client:
        ids = [client.submit(p, params, a) for a in (None, 0) for p in prompts]
        got = [[t for out in client.wait(i, timeout=120) for t in out.new_token_ids] for i in ids]
    assert got == want


# ---- the router: z-loss and train_router --------------------------------------------------
def _with_moe(model, **kw):
    """The model with MoESpec fields changed, as the trainer sets train_router / router_z_loss_coef."""
    import dataclasses

    model.spec = dataclasses.replace(model.spec, moe=dataclasses.replace(model.spec.moe, **kw))
    model.arch = model.family.architecture(model.spec)
    model._cache.clear()
    return model


def test_z_loss_and_its_gradients_equal_torch(folder):
    """loss + router_aux_loss_coef * aux + router_z_loss_coef * z, z = mean over the sparse
    layers' token rows of logsumexp(router logits)^2 (ST-MoE; transformers' router_z_loss_func
    on the layers concatenated): the value and every weight's gradient against torch."""
    from transformers.models.switch_transformers.modeling_switch_transformers import router_z_loss_func

    coef = 0.05
    ours = _with_moe(surogate.load_model(folder), router_z_loss_coef=coef)
    ids = np.random.default_rng(6).integers(0, ours.spec.vocab_size, 27)
    loss, grads = ours.loss_and_grads(ids)
    exe = ours.executable("train", len(ids), 1, grads=True)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    t = torch.tensor(ids)[None]
    out = ref(t, labels=t, output_router_logits=True)
    logits = [r.reshape(-1, ours.spec.moe.num_experts) for r in out.router_logits if r is not None]
    assert len(logits) == len(ours.spec.moe.layers)
    z = router_z_loss_func(torch.cat(logits)[None])
    assert float(exe.read("z_loss")[0]) == pytest.approx(z.item(), rel=1e-5)
    total = out.loss + coef * z
    assert loss == pytest.approx(total.item(), rel=1e-5)
    total.backward()
    ref_grads = {n: p.grad.numpy() for n, p in ref.named_parameters()}
    hf = ours.to_hf(grads)
    gate = [n for n in hf if n.endswith("mlp.gate.weight")]
    assert gate
    for name, g in hf.items():
        r = ref_grads[name]
        assert np.abs(g - r).max() / (np.abs(r).max() + 1e-12) < 1e-4, name


def test_train_router_under_lora_matches_peft_modules_to_save(folder):
    """train_router with LoRA: the routers' whole weights train beside the adapters, with the
    gradients peft gives them as modules_to_save=["gate"]; without it they stay frozen."""
    pm = _peft_model(folder, ATTN + EXPERT_TARGETS, modules_to_save=["gate"])
    cfg = LoRAConfig(rank=4, alpha=8, targets=tuple(ATTN + EXPERT_TARGETS))
    from surogate.models.peft import from_peft_tensors

    params = from_peft_tensors(peft_tensors(pm), cfg)
    ours = surogate.load_model(folder)
    ids = np.random.default_rng(8).integers(0, ours.spec.vocab_size, 17)
    lora_only = {k: v for k, v in params.items() if "lora_" in k}
    _, frozen = ours.loss_and_grads(ids, lora=cfg, lora_params=lora_only)
    assert not any(n.endswith("mlp.gate.weight") for n in frozen)
    _with_moe(ours, train_router=True)
    loss, grads = ours.loss_and_grads(ids, lora=cfg, lora_params=lora_only)
    t = torch.tensor(ids)[None]
    out = pm(input_ids=t, labels=t)
    out.loss.backward()
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    ref = from_peft_tensors(peft_tensors(pm, "grad"), cfg)
    assert set(grads) == set(ref) and any(n.endswith("mlp.gate.weight") for n in grads)
    for name, g in grads.items():
        r = ref[name]
        assert np.abs(g - r).max() / (np.abs(r).max() + 1e-12) < 1e-4, name


def test_train_router_false_freezes_the_router_in_a_full_finetune(folder):
    ours = _with_moe(surogate.load_model(folder), train_router=False)
    _, grads = ours.loss_and_grads(np.arange(5, 18))
    assert "layers.0.mlp.experts.gate_up_proj" in grads
    assert not any(n.endswith("mlp.gate.weight") for n in grads)


@pytest.mark.cuda
def test_expert_lora_router_and_z_loss_on_cuda_match_the_cpu(folder):
    """The GPU backend against the CPU one (itself checked against peft / torch above): expert
    LoRA with the routers trained beside it and the z-loss on, f32 loss and every gradient."""
    from surogate import _native

    if not (_native.build_info()["cuda"] and _native.cuda_devices()):
        pytest.skip("no CUDA build or no GPU")
    cfg = LoRAConfig(rank=4, alpha=8, targets=tuple(ATTN + EXPERT_TARGETS))
    cpu = _with_moe(surogate.load_model(folder), train_router=True, router_z_loss_coef=0.05)
    gpu = _with_moe(surogate.load_model(folder, device="cuda"), train_router=True, router_z_loss_coef=0.05)
    params = _our_adapter(cpu, cfg, seed=9)
    ids = [np.random.default_rng(s).integers(0, cpu.spec.vocab_size, n) for s, n in ((1, 37), (2, 90))]
    loss_c, grads_c = cpu.loss_and_grads(ids, lora=cfg, lora_params=params)
    loss_g, grads_g = gpu.loss_and_grads(ids, lora=cfg, lora_params=params)
    assert loss_g == pytest.approx(loss_c, rel=1e-4)
    assert set(grads_g) == set(grads_c) and any(n.endswith("mlp.gate.weight") for n in grads_c)
    for name, g in grads_c.items():
        assert np.abs(grads_g[name] - g).max() / (np.abs(g).max() + 1e-12) < 1e-3, name


def test_a_per_expert_adapter_of_transformers_4_reads_as_peft_converts_it(folder, tmp_path):
    """An adapter trained before transformers 5 (a Linear per expert: mlp.experts.3.gate_proj.
    lora_A.weight) loads stacked (gate and up along the rank, their B's block-diagonal) and
    gives the logits peft 0.21 gives after its own conversion."""
    peft = pytest.importorskip("peft")
    from safetensors.numpy import save_file

    from surogate.train.lora import load_peft_adapter

    ours = surogate.load_model(folder)
    m, r = ours.spec.moe, 4
    C, F = ours.spec.hidden_size, m.intermediate_size
    rng = np.random.default_rng(11)
    tensors = {}
    for i in m.layers:
        for e in range(m.num_experts):
            for proj, (out, inp) in {"gate_proj": (F, C), "up_proj": (F, C), "down_proj": (C, F)}.items():
                key = f"base_model.model.model.layers.{i}.mlp.experts.{e}.{proj}"
                tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((r, inp)) * 0.2).astype(np.float32)
                tensors[f"{key}.lora_B.weight"] = (rng.standard_normal((out, r)) * 0.2).astype(np.float32)
    adapter = tmp_path / "v4"
    adapter.mkdir()
    save_file(tensors, str(adapter / "adapter_model.safetensors"), metadata={"format": "pt"})
    (adapter / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": 8, "lora_dropout": 0.0, "bias": "none",
        "target_modules": EXPERT_TARGETS, "base_model_name_or_path": str(folder)}))
    cfg, params = load_peft_adapter(adapter)
    assert params["layers.0.mlp.experts.gate_up_proj.lora_A"].shape == (m.num_experts, 2 * r, C)
    ids = np.random.default_rng(5).integers(0, ours.spec.vocab_size, 19)
    exe = ours.executable("logits", len(ids), 1, lora=cfg)
    ours._feed(exe, *surogate.model.pack(ids), params)
    exe.run()
    got = np.array(exe.read("logits"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    tuned = peft.PeftModel.from_pretrained(hf, str(adapter)).eval()
    want = _hf_logits(tuned, ids)
    with tuned.disable_adapter():
        plain = _hf_logits(tuned, ids)
    assert np.abs(want - plain).max() > 1e-2
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4
