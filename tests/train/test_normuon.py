"""NorMuon and Muon (surogate/train/muon.py) against a torch reference written from the papers
(NorMuon: Li et al. 2025, Algorithm 1; Muon: Keller Jordan's muon_update), on the CPU: several
steps over the same gradients give the same weights, for a full fine-tune (matrices by
Newton-Schulz, the rest by torch.optim.AdamW) and for LoRA (A and B by Newton-Schulz); the
state survives a checkpoint round trip; the trainer runs it from YAML keys."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import surogate  # noqa: E402
from sgtest.qa import interrupt_after, sft_config, step_losses, step_records, write_qa  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402
from surogate.model import pack, shift_labels  # noqa: E402
from surogate.train.muon import Muon, MuonParams, fused_parts  # noqa: E402
from surogate.train.optimizer import AdamWParams  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402

COEF = (3.4445, -4.7750, 2.0315)


# ---- the reference, from the papers -----------------------------------------------------------
def newton_schulz(G: torch.Tensor, steps: int, coef=COEF) -> torch.Tensor:
    a, b, c = coef
    X = G / (G.norm() + 1e-7)
    t = X.size(0) > X.size(1)
    if t:
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    return X.T if t else X


class Reference:
    """NorMuon / Muon for the matrices (each fused part its own matrix), torch's AdamW for the rest."""

    def __init__(self, params: dict[str, np.ndarray], matrices: dict[str, int], mp: MuonParams, hp: AdamWParams):
        self.p = {n: torch.tensor(a, dtype=torch.float32) for n, a in params.items()}
        self.matrices, self.mp, self.hp = matrices, mp, hp
        self.M = {n: torch.zeros_like(self.p[n]) for n in matrices}
        self.v = {n: torch.zeros(self.p[n].shape[0]) for n in matrices}
        rest = [n for n in params if n not in matrices]
        self.adam_p = {n: torch.nn.Parameter(self.p[n]) for n in rest}
        decay = [self.adam_p[n] for n in rest if not (n.endswith(".bias") or "norm" in n)]
        no = [self.adam_p[n] for n in rest if n.endswith(".bias") or "norm" in n]
        groups = [g for g in ({"params": decay}, {"params": no, "weight_decay": 0.0}) if g["params"]]
        self.adam = torch.optim.AdamW(groups, lr=hp.lr, betas=(hp.beta1, hp.beta2), eps=hp.eps,
                                      weight_decay=hp.weight_decay, foreach=False) if groups else None

    def step(self, grads: dict[str, np.ndarray], lr: float) -> None:
        mp, hp = self.mp, self.hp
        g = {n: torch.tensor(a) for n, a in grads.items()}
        norm = torch.sqrt(sum((x.double() ** 2).sum() for x in g.values())).float()
        clip = min(1.0, hp.max_grad_norm / (norm.item() + 1e-6))
        g = {n: x * clip for n, x in g.items()}
        mlr = lr * mp.lr_scale
        for n, k in self.matrices.items():
            W, M, v = self.p[n], self.M[n], self.v[n]
            R = W.shape[0] // k
            for part in range(k):
                rows = slice(part * R, (part + 1) * R)
                Mp = M[rows]
                Mp.lerp_(g[n][rows], 1 - mp.momentum)
                if mp.normuon:
                    O = newton_schulz(Mp, mp.ns_steps)
                    v[rows] = mp.beta2 * v[rows] + (1 - mp.beta2) * (O * O).mean(dim=1)
                    U = O / (v[rows].sqrt()[:, None] + mp.eps)
                    step = 0.2 * mlr * math.sqrt(U.numel()) / U.norm().item()
                else:
                    u = g[n][rows].lerp(Mp, mp.momentum) if mp.nesterov else Mp
                    U = newton_schulz(u, mp.ns_steps)
                    step = mlr * math.sqrt(max(1.0, R / W.shape[1]))
                Wp = W[rows]
                mask = (U * Wp >= 0) if mp.cautious_wd else torch.ones_like(Wp, dtype=torch.bool)
                Wp.mul_(torch.where(mask, 1 - mlr * hp.weight_decay, 1.0))
                Wp.add_(U, alpha=-step)
        if self.adam is not None:
            for n, p in self.adam_p.items():
                p.grad = g[n]
            for group in self.adam.param_groups:
                group["lr"] = lr
            self.adam.step()


# ---- ours, driven one step at a time ------------------------------------------------------------
class Ours:
    def __init__(self, model, ids, lora=None, lora_params=None, mp=None, hp=None):
        ids, pos, cu = pack(ids)
        self.exe = exe = model.executable("train", len(ids), 1, lora=lora, grads=True, shared=False)
        if lora is None:
            self.params = {n: np.array(model.params[n], np.float32) for n in exe.external_names("param")
                           if n in model.params}
        else:
            self.params = {n: a.copy() for n, a in lora_params.items()}
        for n, a in self.params.items():
            exe.bind(n, a)
        exe.bind("input_ids", ids)
        exe.bind("position_ids", pos)
        exe.bind("cu_seqlens", cu)
        targets = shift_labels([ids])
        exe.bind("targets", targets)
        exe.bind("dloss", np.full(len(ids), 1.0 / (targets != -100).sum(), np.float32))
        self.grads = {}
        for name in exe.external_names("grad"):
            self.grads[name[5:]] = arr = np.zeros(exe.buf(name).shape, np.float32)
            exe.bind(name, arr)
        self.opt = Muon(exe, {n: self.params[n] for n in self.grads}, hp, mp, name_table=model.family.name_table())

    def backward(self) -> dict[str, np.ndarray]:
        self.exe.run("forward", "backward")
        return {n: g.copy() for n, g in self.grads.items()}


def run_both(model, mp, hp, lora=None, lora_params=None, steps=3, lr=1e-2):
    ids = np.random.default_rng(2).integers(0, model.spec.vocab_size, 24)
    ours = Ours(model, ids, lora, lora_params, mp, hp)
    ref = Reference({n: ours.params[n] for n in ours.grads},
                    {n: fused_parts(model.family.name_table(), n) for n in ours.opt.matrices}, mp, hp)
    for _ in range(steps):
        grads = ours.backward()
        ours.opt.apply(lr)
        ref.step(grads, lr)
    return ours, ref


def assert_same(ours, ref, decay=0.0, rtol=2e-5):
    """Every weight within rtol of the reference's, but for the rare element whose cautious-decay
    mask (the sign of update * weight) flips on a last-bit difference of a near-zero update: it
    differs by the decay alone, lr * wd * |w| per step."""
    for n in ours.grads:
        want = ref.p[n].detach().numpy()
        scale = np.abs(want).max() + 1e-12
        diff = np.abs(ours.params[n] - want)
        off = diff > rtol * scale
        assert off.sum() <= max(1, off.size // 1000), f"{n}: {off.sum()} elements off, max {diff.max() / scale:.2e}"
        assert np.all(diff[off] <= 3 * decay * np.abs(want[off]) + rtol * scale), f"{n}: {diff.max() / scale:.2e}"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return surogate.load_model(make_model("llama", tmp_path_factory.mktemp("m") / "base", seed=3))


@pytest.mark.parametrize("variant", ["normuon", "normuon-plain-wd", "muon-nesterov"])
def test_full_fine_tune_steps_match_the_reference(llama, variant):
    mp = {"normuon": MuonParams(normuon=True),
          "normuon-plain-wd": MuonParams(normuon=True, cautious_wd=False, beta2=0.9, lr_scale=0.5),
          "muon-nesterov": MuonParams(normuon=False, nesterov=True, ns_steps=4)}[variant]
    hp = AdamWParams(lr=1e-2, weight_decay=0.1, max_grad_norm=0.5)
    ours, ref = run_both(llama, mp, hp)
    decay = 1e-2 * mp.lr_scale * hp.weight_decay if mp.cautious_wd else 0.0
    mats = set(ours.opt.matrices)
    assert "layers.0.mlp.gate_up_proj.weight" in mats and "layers.0.self_attn.q_proj.weight" in mats
    assert not mats & {"embed_tokens.weight", "lm_head.weight", "norm.weight", "layers.0.input_layernorm.weight"}
    assert ours.opt.parts["layers.0.mlp.gate_up_proj.weight"] == 2  # gate and up: two Muon matrices
    assert_same(ours, ref, decay)


def test_lora_adapters_are_muon_matrices_and_match_the_reference(llama):
    targets = ("q_proj", "v_proj", "gate_proj", "down_proj")
    lora = LoRAConfig(rank=4, alpha=8, targets=targets)
    g = llama.arch.build(mode="train", dtype=llama.dtype, lora=lora)
    rng = np.random.default_rng(5)
    lora_params = {p.name: (rng.standard_normal(p.shape) * 0.1).astype(np.float32) for p in g.params()
                   if p.meta.get("lora")}
    hp = AdamWParams(lr=1e-2, weight_decay=0.05, max_grad_norm=1.0)
    ours, ref = run_both(llama, MuonParams(normuon=True), hp, lora=lora, lora_params=lora_params)
    assert sorted(ours.opt.matrices) == sorted(lora_params)
    assert_same(ours, ref, decay=1e-2 * hp.weight_decay)


def test_state_survives_a_checkpoint_round_trip(llama):
    mp, hp = MuonParams(normuon=True), AdamWParams(lr=1e-2, weight_decay=0.1)
    ids = np.random.default_rng(2).integers(0, llama.spec.vocab_size, 24)
    a = Ours(llama, ids, mp=mp, hp=hp)
    for _ in range(2):
        a.backward()
        a.opt.apply(1e-2)
    state = a.opt.state()
    assert any(k.startswith("v/layers.0.self_attn.q_proj") for k in state)
    assert state["v/layers.0.self_attn.q_proj.weight"].shape == (a.params["layers.0.self_attn.q_proj.weight"].shape[0],)
    b = Ours(llama, ids, mp=mp, hp=hp)
    for n, arr in a.params.items():
        b.params[n][...] = arr
    b.opt.load_state(state)
    for o in (a, b):
        o.backward()
        o.opt.apply(1e-2)
    for n in a.params:
        assert np.array_equal(a.params[n], b.params[n]), n


@pytest.mark.parametrize("optimizer", ["normuon", "muon"])
def test_sft_trains_with_the_optimizer_keys(tmp_path, optimizer):
    data = write_qa(tmp_path / "qa.jsonl")
    base = make_model("llama", tmp_path / "base", seed=5)
    extra = {"muon_learning_rate": 0.02} if optimizer == "muon" else {}
    t = Trainer(sft_config(base, data, tmp_path / "out", optimizer=optimizer, normuon_momentum=0.9,
                           muon_ns_steps=5, weight_decay=0.01, sequence_len=128, **extra))
    assert isinstance(t.opt, Muon) and t.opt.mp.normuon == (optimizer == "normuon")
    t.train()
    losses = step_losses(tmp_path / "out")
    assert losses[-1] < losses[0] - 0.3, losses


def test_a_resumed_normuon_run_reproduces_the_uninterrupted_curve(tmp_path):
    from surogate.train.checkpoint import latest_checkpoint

    data = write_qa(tmp_path / "qa.jsonl")
    base = make_model("llama", tmp_path / "base", seed=5)

    def cfg(out, **kw):
        return sft_config(base, data, out, optimizer="normuon", lora=False, learning_rate=5e-3, save_steps=3,
                          sequence_len=128, weight_decay=0.01, **kw)

    Trainer(cfg(tmp_path / "a")).train()
    want = step_losses(tmp_path / "a")
    interrupted = Trainer(cfg(tmp_path / "b"))
    interrupt_after(interrupted, 4)
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    assert latest_checkpoint(tmp_path / "b" / "checkpoints").name == "step_00000003"
    Trainer(cfg(tmp_path / "b", resume_from_checkpoint=True)).train()
    by_step = {r["step"]: r["loss"] for r in step_records(tmp_path / "b")}
    assert [by_step[s] for s in range(1, 7)] == want
