"""LoRA dropout (peft's lora_dropout): the `dropout_fwd` op and its hash mask, the lowering
(adapters read dropout(x), the base reads x; backward recomputes the mask), gradients against
a hand-written torch forward with the same masks, and the trainer (trains, resumes exactly)."""

from __future__ import annotations


import numpy as np
import pytest

from sgtest.ops import run_op
from sgtest.qa import interrupt_after, sft_config, step_records, write_qa
from surogate.autodiff import backward
from surogate.compile.executable import Executable
from surogate.dsl import ops
from surogate.dsl.graph import Graph
from surogate.dsl.nn import LORA_RNG, Linear, LoRAConfig


def keep_mask(shape, p, seed=0, offset=0, rng=None, dtype=np.float32):
    """The op's mask times 1/(1-p), read by running dropout_fwd on ones."""
    ins = [np.ones(shape, dtype)] + ([rng] if rng is not None else [])
    (y,) = run_op("dropout_fwd", ins, [(shape, np.dtype(dtype).name)], p=p, seed=seed, offset=offset)
    return y


# ---- the op -----------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_keeps_one_minus_p_and_scales(p):
    x = np.random.default_rng(0).standard_normal((200, 257)).astype(np.float32)
    (y,) = run_op("dropout_fwd", [x], [(x.shape, "float32")], p=p, seed=42, offset=7)
    kept = y != 0
    assert abs(kept.mean() - (1 - p)) < 0.01
    np.testing.assert_allclose(y[kept], x[kept] / (1 - p), rtol=1e-6)
    # Same seed and offset: the same mask; another offset or seed: another one.
    (y2,) = run_op("dropout_fwd", [x], [(x.shape, "float32")], p=p, seed=42, offset=7)
    np.testing.assert_array_equal(y, y2)
    (y3,) = run_op("dropout_fwd", [x], [(x.shape, "float32")], p=p, seed=42, offset=8)
    (y4,) = run_op("dropout_fwd", [x], [(x.shape, "float32")], p=p, seed=43, offset=7)
    assert (y3 != 0).mean() == pytest.approx(1 - p, abs=0.01)
    assert np.mean((y3 != 0) != kept) > 0.05 and np.mean((y4 != 0) != kept) > 0.05


def test_dropout_mask_is_a_function_of_the_flat_index_and_the_rng_tensor():
    m = keep_mask((64, 64), 0.3, seed=5, offset=100)
    # offset + i: shifting the offset by k shifts the mask by k elements.
    m2 = keep_mask((64 * 64 - 10,), 0.3, seed=5, offset=110)
    np.testing.assert_array_equal(m.reshape(-1)[10:], m2)
    # The rng tensor (int32 [2], low/high words) is XORed into the seed attr.
    rng = np.array([5, 0], np.int32)
    np.testing.assert_array_equal(keep_mask((64, 64), 0.3, seed=0, offset=100, rng=rng), m)
    other = keep_mask((64, 64), 0.3, seed=0, offset=100, rng=np.array([5, 1], np.int32))
    assert np.mean(other != m) > 0.1
    # Backward is the same op on dy: in place works, bf16 too, p = 0 is the identity.
    dy = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    ref = dy * m
    run_op("dropout_fwd", [dy], [dy], p=0.3, seed=5, offset=100)
    np.testing.assert_allclose(dy, ref, rtol=1e-6)
    (y,) = run_op("dropout_fwd", [ref], [((64, 64), "float32")], p=0.0, seed=5)
    np.testing.assert_array_equal(y, ref)


# ---- graphs -----------------------------------------------------------------------------------
N, C, F, V, R = 12, 16, 24, 40, 4


def mlp_graph(p: float, grads: bool = True):
    """x -> fused gate/up linear (two LoRA slices) -> down linear (LoRA) -> CE head."""
    g = Graph("mlp")
    lora = LoRAConfig(rank=R, alpha=8.0, targets=("gate_proj", "up_proj", "down_proj"), dropout=p)
    x = g.input("x", (N, C), "float32")
    h = Linear("mlp.gate_up_proj", C, [("gate_proj", F), ("up_proj", F)])(g, x, "float32", lora)
    y = Linear("mlp.down_proj", 2 * F, [("down_proj", C)])(g, h, "float32", lora)
    head = g.param("head", (V, C), "float32", trainable=False)
    loss = ops.lm_head_ce(y, head, g.input("targets", (N,), "int32"), name="loss")
    g.mark_output("loss", loss)
    if grads:
        backward(g, loss)
    return g, Executable(g, {}, keep=[loss]), lora


def bind_all(exe, g, rng_words=(123, 456)):
    r = np.random.default_rng(3)
    vals = {}
    for v in g.params():
        a = (r.standard_normal(exe.buf(v.name).shape) * 0.3).astype(np.float32)
        exe.bind(v.name, a)
        vals[v.name] = a
    vals["x"] = r.standard_normal((N, C)).astype(np.float32)
    vals["targets"] = r.integers(0, V, N).astype(np.int32)
    vals["dloss"] = np.full(N, 1.0 / N, np.float32)
    vals[LORA_RNG] = np.array(rng_words, np.int32)
    for n in ("x", "targets", "dloss", LORA_RNG):
        if n in exe.lowered.by_value:
            exe.bind(n, vals[n])
    grads = {}
    for n in exe.external_names("grad"):
        grads[n] = np.zeros(exe.buf(n).shape, np.float32)
        exe.bind(n, grads[n])
    return vals, grads


def ops_of(exe):
    return [i.op for i in exe.lowered.instrs]


def test_p0_graphs_are_unchanged():
    g0, e0, _ = mlp_graph(0.0)
    gd, ed, _ = mlp_graph(0.0)
    assert repr(g0) == repr(gd) and ops_of(e0) == ops_of(ed)
    assert "dropout_fwd" not in ops_of(e0) and LORA_RNG not in g0.values
    n = next(n for n in g0.nodes if n.op == "linear")
    assert "dropout" not in n.attrs
    assert LoRAConfig().dropout == 0.0
    # With p > 0 the program is the p = 0 one plus the dropouts (and the add of x's LoRA part).
    _, ep, _ = mlp_graph(0.3)
    ops_p = ops_of(ep)
    stripped = [o for i, o in enumerate(ops_p)
                if o != "dropout_fwd" and not (o == "add" and ops_p[i - 1] == "dropout_fwd")]
    assert stripped == ops_of(e0)


def test_eval_lowering_has_no_dropout_and_matches_p0():
    g, exe, _ = mlp_graph(0.2, grads=False)
    assert "dropout_fwd" not in ops_of(exe) and LORA_RNG not in exe.lowered.by_value
    g0, exe0, _ = mlp_graph(0.0, grads=False)
    bind_all(exe, g)
    bind_all(exe0, g0)
    exe.run()
    exe0.run()
    np.testing.assert_array_equal(exe.read("loss"), exe0.read("loss"))


def test_lora_gradients_equal_torch_with_the_same_masks():
    torch = pytest.importorskip("torch")
    p = 0.25
    g, exe, lora = mlp_graph(p)
    # forward and dA input per linear; dx only for the down projection (x needs no gradient)
    assert ops_of(exe).count("dropout_fwd") == 2 + 2 + 1
    vals, grads = bind_all(exe, g)
    exe.run()
    # The masks: dropout_fwd on ones with each linear's offset and this step's rng.
    lin = [n for n in g.nodes if n.op == "linear"]
    m1 = keep_mask((N, C), p, offset=lin[0].attrs["dropout_offset"], rng=vals[LORA_RNG])
    m2 = keep_mask((N, 2 * F), p, offset=lin[1].attrs["dropout_offset"], rng=vals[LORA_RNG])
    assert lin[0].attrs["dropout_offset"] != lin[1].attrs["dropout_offset"]
    assert 0 < (m1 == 0).mean() < 0.5 and 0 < (m2 == 0).mean() < 0.5

    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=k.endswith(("lora_A", "lora_B")))
         for k, v in vals.items() if k not in ("targets", LORA_RNG)}
    s = lora.scale
    x = t["x"]
    xd = x * torch.tensor(m1, dtype=torch.float64)
    gate = xd @ t["mlp.gate_proj.lora_A"].T @ t["mlp.gate_proj.lora_B"].T
    up = xd @ t["mlp.up_proj.lora_A"].T @ t["mlp.up_proj.lora_B"].T
    h = x @ t["mlp.gate_up_proj.weight"].T + s * torch.cat([gate, up], 1)
    hd = h * torch.tensor(m2, dtype=torch.float64)
    y = h @ t["mlp.down_proj.weight"].T + s * (hd @ t["mlp.down_proj.lora_A"].T @ t["mlp.down_proj.lora_B"].T)
    per_tok = torch.nn.functional.cross_entropy(y @ t["head"].T, torch.tensor(vals["targets"]).long(),
                                                reduction="none")
    np.testing.assert_allclose(exe.read("loss"), per_tok.detach().numpy(), rtol=1e-4, atol=1e-4)
    (per_tok * t["dloss"]).sum().backward()
    checked = 0
    for name, arr in grads.items():
        ref = t[name[len("grad."):]].grad.numpy()
        np.testing.assert_allclose(arr, ref, rtol=1e-4, atol=1e-4, err_msg=name)
        checked += 1
    assert checked == 6
    # A different step seed: different masks, different gradients.
    before = {n: a.copy() for n, a in grads.items()}
    for a in grads.values():
        a[...] = 0
    exe.bound(LORA_RNG)[:] = [7, 8]
    exe.run()
    assert not np.allclose(grads["grad.mlp.down_proj.lora_A"], before["grad.mlp.down_proj.lora_A"])


def test_recompute_gives_bit_identical_gradients(tmp_path):
    pytest.importorskip("torch")
    from sgtest.tiny_models import make_qwen3

    import surogate

    base = make_qwen3(tmp_path / "base", seed=3)
    out = []
    for recompute in (False, True):
        m = surogate.load_model(base)
        lora = LoRAConfig(rank=4, alpha=8.0, dropout=0.3)
        ids = np.arange(1, 20) % m.spec.vocab_size
        exe = m.executable("train", len(ids), 1, lora=lora, grads=True, recompute=recompute)
        assert "dropout_fwd" in ops_of(exe)
        exe.bind(LORA_RNG, np.array([11, 22], np.int32))
        r = np.random.default_rng(0)
        params = {v.name: (r.standard_normal(v.shape) * 0.05).astype(np.float32)
                  for v in exe.graph.params() if v.meta.get("lora")}
        out.append(m._train_step(ids, None, grads=True, lora=lora, lora_params=params, recompute=recompute))
    assert out[0][0] == out[1][0]
    for n in out[0][1]:
        np.testing.assert_array_equal(out[0][1][n], out[1][1][n], err_msg=n)


# ---- trainer ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base(tmp_path_factory):
    pytest.importorskip("torch")
    from sgtest.tiny_models import make_qwen3

    return make_qwen3(tmp_path_factory.mktemp("base"), seed=11, initializer_range=0.2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_qa(tmp_path_factory.mktemp("data") / "qa.jsonl")


def config(base, data, out, **kw):
    return sft_config(base, data, out, **{"lora_dropout": 0.1, **kw})


def test_trainer_with_lora_dropout_trains_and_resumes_exactly(base, data, tmp_path):
    from surogate.train.checkpoint import latest_checkpoint
    from surogate.train.trainer import Trainer

    full = Trainer(config(base, data, tmp_path / "a", save_steps=3, max_steps=8))
    assert "dropout_fwd" in ops_of(full.exe)
    full.train()
    losses_a = [r["loss"] for r in step_records(tmp_path / "a")]
    assert np.mean(losses_a[-2:]) < 0.7 * np.mean(losses_a[:2]), losses_a

    interrupted = Trainer(config(base, data, tmp_path / "b", save_steps=3, max_steps=8))
    interrupt_after(interrupted, 4)
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    assert latest_checkpoint(tmp_path / "b" / "checkpoints").name == "step_00000003"
    Trainer(config(base, data, tmp_path / "b", save_steps=3, max_steps=8, resume_from_checkpoint=True)).train()
    by_step = {r["step"]: r["loss"] for r in step_records(tmp_path / "b")}
    assert [by_step[s] for s in range(1, 9)] == losses_a

    # Dropout changes the curve (the masks are really applied), deterministically.
    no_dropout = Trainer(config(base, data, tmp_path / "c", max_steps=3, lora_dropout=0.0))
    assert "dropout_fwd" not in ops_of(no_dropout.exe)
    no_dropout.train()
    assert [r["loss"] for r in step_records(tmp_path / "c")][1:3] != losses_a[1:3]
