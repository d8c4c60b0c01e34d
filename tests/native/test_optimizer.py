"""global_norm and adamw against torch.nn.utils.clip_grad_norm_ + torch.optim.AdamW."""

import ml_dtypes
import numpy as np
import pytest
import torch

from sgtest.ops import as_dtype
from surogate import _native
from surogate.errors import DTypeError, InvalidArgumentError, ShapeError

SHAPES = [(7,), (13, 5), (3, 17, 2), (1,), (40001,)]  # the last spans two 32768-element blocks
NO_DECAY = [1, 3]


def f32(x: float) -> float:
    """x as the f32 value hp carries, so that torch sees the same hyperparameter."""
    return float(np.float32(x))


LR, BETAS, EPS, WD = f32(3e-3), (f32(0.9), f32(0.999)), f32(1e-8), f32(0.1)


def hp(step: int, max_norm: float = 0.0, lr=LR, betas=BETAS, eps=EPS, wd=WD) -> np.ndarray:
    return np.array([lr, betas[0], betas[1], eps, wd, step, max_norm, 0], np.float32)


def global_norm(grads) -> np.ndarray:
    out = np.zeros(1, np.float32)
    _native.call_op("global_norm", list(grads), [out])
    return out


class NativeAdamW:
    """Our side of the comparison: state arrays plus the flat adamw input list."""

    def __init__(self, params, masters=None):
        self.params = params
        self.masters = masters or [None] * len(params)
        self.m = [np.zeros(p.shape, np.float32) for p in params]
        self.v = [np.zeros(p.shape, np.float32) for p in params]
        self.t = 0

    def step(self, grads, max_norm=0.0, no_decay=NO_DECAY, clip=True):
        self.t += 1
        norm = global_norm(grads) if clip else None
        inputs = [hp(self.t, max_norm), norm]
        for p, ms, g, m, v in zip(self.params, self.masters, grads, self.m, self.v):
            inputs += [p, ms, g, m, v]
        _native.call_op("adamw", inputs, [], {"no_decay": no_decay})


def torch_adamw(init, grad_steps, max_norm=None, no_decay=NO_DECAY):
    """The reference: AdamW (foreach=False) with the no_decay groups at weight_decay=0."""
    params = [torch.nn.Parameter(torch.from_numpy(x.astype(np.float32).copy())) for x in init]
    groups = [
        {"params": [p for i, p in enumerate(params) if i not in no_decay]},
        {"params": [p for i, p in enumerate(params) if i in no_decay], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, foreach=False)
    for grads in grad_steps:
        for p, g in zip(params, grads):
            p.grad = torch.from_numpy(g.astype(np.float32).copy())
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=False)
        opt.step()
    return [p.detach().numpy() for p in params]


def make(seed, grad_dtype="float32", steps=5, grad_scale=1.0):
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[as_dtype(grad_scale * rng.standard_normal(s), grad_dtype) for s in SHAPES] for _ in range(steps)]
    return init, grads


@pytest.mark.parametrize("max_norm", [None, 1.0, 1e4])  # off, clipping every step, never clipping
def test_adamw_f32_matches_torch(max_norm):
    init, grad_steps = make(0)
    ours = NativeAdamW([x.copy() for x in init])
    for grads in grad_steps:
        ours.step(grads, max_norm=max_norm or 0.0, clip=max_norm is not None)
    ref = torch_adamw(init, grad_steps, max_norm)
    for i, (p, r) in enumerate(zip(ours.params, ref)):
        np.testing.assert_allclose(p, r, rtol=1e-6, atol=1e-7, err_msg=f"param {i}")


def test_no_decay_groups_differ_only_by_decay():
    init, grad_steps = make(1, steps=1)
    with_decay = NativeAdamW([x.copy() for x in init])
    with_decay.step(grad_steps[0], no_decay=[])
    without = NativeAdamW([x.copy() for x in init])
    without.step(grad_steps[0], no_decay=list(range(len(SHAPES))))
    for a, b, x in zip(with_decay.params, without.params, init):
        np.testing.assert_allclose(a - b, -LR * WD * x, rtol=1e-3, atol=1e-8)


def test_bf16_params_with_f32_master():
    init, grad_steps = make(2, grad_dtype="bfloat16")
    masters = [x.copy() for x in init]
    params = [as_dtype(x, "bfloat16") for x in init]
    ours = NativeAdamW(params, masters)
    for grads in grad_steps:
        ours.step(grads, max_norm=1.0)
    ref = torch_adamw(init, grad_steps, 1.0)  # torch on the f32 master with the bf16 grads' values
    for i, (p, ms, r) in enumerate(zip(ours.params, ours.masters, ref)):
        np.testing.assert_allclose(ms, r, rtol=1e-6, atol=1e-7, err_msg=f"master {i}")
        assert p.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(p.view(np.uint16), as_dtype(ms, "bfloat16").view(np.uint16))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_param_without_master_rounds_the_f32_update(dtype):
    init, grad_steps = make(3, grad_dtype=dtype, steps=1)
    low = [as_dtype(x, dtype) for x in init]
    ours = NativeAdamW([x.copy() for x in low])
    ours.step(grad_steps[0], max_norm=1.0)
    wide = NativeAdamW([x.astype(np.float32) for x in low])
    wide.step(grad_steps[0], max_norm=1.0)
    for p, w in zip(ours.params, wide.params):
        np.testing.assert_array_equal(p.view(np.uint16), as_dtype(w, dtype).view(np.uint16))
    for a, b in zip(ours.m + ours.v, wide.m + wide.v):
        np.testing.assert_array_equal(a, b)


def test_global_norm_matches_f64():
    rng = np.random.default_rng(4)
    xs = [
        rng.standard_normal((300, 257)).astype(np.float32) * 1e3,
        None,
        as_dtype(rng.standard_normal(70001), "bfloat16"),
        rng.standard_normal((5, 3)).astype(np.float16),
        rng.standard_normal(9),  # float64
        np.zeros((0, 4), np.float32),
    ]
    ref = np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in xs if x is not None))
    got = global_norm(xs)[0]
    assert abs(float(got) - ref) <= np.spacing(np.float32(ref))  # within one f32 ulp of the exact value
    assert global_norm([])[0] == 0.0
    assert np.isnan(global_norm([np.array([1.0, np.nan], np.float32)])[0])
    assert np.isinf(global_norm([np.array([1.0, np.inf], np.float32)])[0])


def test_global_norm_is_deterministic_across_thread_counts():
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(200_003).astype(np.float32) * 10.0 ** rng.integers(-3, 4, 200_003) for _ in range(3)]
    before = _native.num_threads()
    try:
        results = []
        for n in (1, 2, 3, 4):
            _native.set_num_threads(n)
            results += [global_norm(xs).view(np.uint32)[0] for _ in range(2)]
    finally:
        _native.set_num_threads(before)
    assert len(set(results)) == 1


def test_thread_pool_resizes_between_runs():
    # Resizing used to start workers that woke once for the finished run and decremented its count a second
    # time, so a later run could return while a worker was still inside it (a segfault or a hang on 2 cores).
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal(200_003).astype(np.float32) for _ in range(3)]
    before = _native.num_threads()
    try:
        results = set()
        for i in range(2000):
            _native.set_num_threads(1 + i % 4)
            results.add(global_norm(xs).view(np.uint32)[0])
    finally:
        _native.set_num_threads(before)
    assert len(results) == 1


def test_adamw_is_deterministic():
    init, grad_steps = make(6, steps=2)
    runs = []
    for _ in range(2):
        ours = NativeAdamW([x.copy() for x in init])
        for grads in grad_steps:
            ours.step(grads, max_norm=1.0)
        runs.append(ours.params + ours.m + ours.v)
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_nan_norm_is_not_skipped():
    # As torch: a NaN norm makes the clip coefficient NaN and every parameter NaN. Skipping
    # such a step is the trainer's decision (it can read the norm before running adamw).
    p = np.ones(4, np.float32)
    inputs = [hp(1, 1.0), np.array([np.nan], np.float32), p, None, np.ones(4, np.float32),
              np.zeros(4, np.float32), np.zeros(4, np.float32)]
    _native.call_op("adamw", inputs, [])
    assert np.isnan(p).all()


def group(n=4, **over):
    g = {"param": np.ones(n, np.float32), "master": None, "grad": np.ones(n, np.float32),
         "m": np.zeros(n, np.float32), "v": np.zeros(n, np.float32)}
    g.update(over)
    return [g["param"], g["master"], g["grad"], g["m"], g["v"]]


@pytest.mark.parametrize("inputs, attrs, error, match", [
    ([hp(1), None] + group()[:4], {}, InvalidArgumentError, "2 \\+ 5\\*k"),
    ([hp(1), None] + group() + group(grad=None), {}, InvalidArgumentError, "group 1 \\(input 9, grad\\) is missing"),
    ([hp(1), None] + group(m=np.zeros(4, ml_dtypes.bfloat16)), {}, DTypeError, "group 0 \\(input 5, m\\) has dtype bfloat16"),
    ([hp(1), None] + group(master=np.ones(4, np.float16)), {}, DTypeError, "group 0 .*master"),
    ([hp(1), None] + group() + group() + group(v=np.zeros(5, np.float32)), {}, ShapeError, "group 2 .*v"),
    ([hp(1), None] + group(), {"no_decay": [1]}, InvalidArgumentError, "no_decay names group 1"),
    ([np.zeros(7, np.float32), None] + group(), {}, ShapeError, "hp must be"),
    ([hp(0), None] + group(), {}, InvalidArgumentError, "step 0"),
    ([hp(1, betas=(1.0, 0.999)), None] + group(), {}, InvalidArgumentError, "betas"),
    ([hp(1, 1.0), np.zeros(2, np.float32)] + group(), {}, ShapeError, "norm must be"),
])
def test_adamw_errors_name_the_group(inputs, attrs, error, match):
    with pytest.raises(error, match=match):
        _native.call_op("adamw", inputs, [], attrs)


def test_adamw_refuses_read_only_state():
    p = np.ones(4, np.float32)
    p.flags.writeable = False
    with pytest.raises(InvalidArgumentError, match="group 0 \\(input 2, param\\) is read-only"):
        _native.call_op("adamw", [hp(1), None] + group(param=p), [])


def test_global_norm_errors():
    with pytest.raises(ShapeError, match="global_norm: output norm must be float32\\[1\\]"):
        _native.call_op("global_norm", [np.ones(3, np.float32)], [np.zeros(2, np.float32)])
    with pytest.raises(DTypeError, match="global_norm: input 1"):
        _native.call_op("global_norm", [np.ones(3, np.float32), np.ones(3, np.int32)], [np.zeros(1, np.float32)])
    with pytest.raises(InvalidArgumentError, match="global_norm: input 0 .*contiguous"):
        _native.call_op("global_norm", [np.ones((4, 4), np.float32)[:, ::2]], [np.zeros(1, np.float32)])
