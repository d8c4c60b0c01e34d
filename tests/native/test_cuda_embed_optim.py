"""The CUDA embedding, dropout and optimizer ops against the CPU backend.

The kernels promise more than closeness: embedding_bwd sums in the CPU's order, the dropout
mask is the same hash, and adamw / adamw8 round every f32 operation as the CPU does, so these
tests compare bits. Skipped on machines without a CUDA build and a GPU.
"""

import numpy as np
import pytest

from sgtest.ops import as_dtype, assert_close, run_op
from surogate import _native

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

COVERS = ("embedding_fwd", "embedding_bwd", "embed_rows", "dropout_fwd", "global_norm", "adamw", "adamw8")

DTYPES = ["float32", "bfloat16", "float16"]


def cuda(x):
    return None if x is None else _native.tensor(x).to("cuda")


def host(t) -> np.ndarray:
    return t.to("cpu").numpy()


def run_cuda(name, inputs, out_specs, **attrs):
    ins = [cuda(x) for x in inputs]
    outs = [_native.zeros(list(shape), dtype, "cuda") for shape, dtype in out_specs]
    _native.call_op(name, ins, outs, attrs)
    return [host(o) for o in outs]


def rand(shape, dtype, seed=0, scale=1.0):
    return as_dtype(scale * np.random.default_rng(seed).standard_normal(shape).astype(np.float32), dtype)


def assert_bits(got, expected, msg=""):
    got, expected = np.ascontiguousarray(got), np.ascontiguousarray(expected)
    assert got.dtype == expected.dtype and got.shape == expected.shape, msg
    np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8), err_msg=msg)


# ---- embedding ------------------------------------------------------------------------------

def token_ids(n, vocab, seed=0):
    """Repeated ids, with one id (a 'padding' token) taking about a third of the tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, n).astype(np.int32)
    ids[rng.random(n) < 0.33] = 3
    return ids


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [67, 64, 1])  # odd rows (narrow copies), 16-byte rows, one channel
def test_embedding_fwd(dtype, C):
    ids, table = token_ids(29, 37), rand((37, C), dtype)
    (expected,) = run_op("embedding_fwd", [ids, table], [((29, C), dtype)])
    (got,) = run_cuda("embedding_fwd", [ids, table], [((29, C), dtype)])
    assert_bits(got, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [67, 64, 2560])
def test_embed_rows(dtype, C):
    # Serving's image rows over token embeddings: the CPU's rounding, bit for bit; -1 skips.
    x, rows = rand((40, C), dtype, 5), rand((9, C), "float32", 6)
    index = np.array([3, 4, 5, -1, 20, 21, 39, 0, -1], np.int32)
    (expected,) = run_op("embed_rows", [x, index, rows], [((40, C), dtype)])
    (got,) = run_cuda("embed_rows", [x, index, rows], [((40, C), dtype)])
    assert_bits(got, expected)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("dtable_f32", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [67, 136, 2100])  # scalar columns; vectorized; several column chunks
def test_embedding_bwd(dtype, dtable_f32, accumulate, C):
    N, V = 301, 50
    ids, dy = token_ids(N, V, 1), rand((N, C), dtype, 2)
    dt_dtype = "float32" if dtable_f32 else dtype
    init = rand((V, C), dt_dtype, 3)  # the kept (accumulate) or overwritten (not) gradient
    expected = init.copy()
    run_op("embedding_bwd", [ids, dy], [expected], accumulate=accumulate)
    out = cuda(init)
    _native.call_op("embedding_bwd", [cuda(ids), cuda(dy)], [out], {"accumulate": accumulate})
    assert_bits(host(out), expected)  # the CPU's summation order: equal, not just close


def test_embedding_out_of_range_ids_are_zero_rows_and_dropped_gradients():
    V, C = 20, 9
    ids = np.array([1, -1, 5, 20, 1, 7], np.int32)
    valid = (ids >= 0) & (ids < V)
    table, dy = rand((V, C), "float32", 4), rand((len(ids), C), "float32", 5)
    (y,) = run_cuda("embedding_fwd", [ids, table], [((len(ids), C), "float32")])
    np.testing.assert_array_equal(y[valid], table[ids[valid]])
    np.testing.assert_array_equal(y[~valid], 0.0)
    (dt,) = run_cuda("embedding_bwd", [ids, dy], [((V, C), "float32")])
    (expected,) = run_op("embedding_bwd", [ids[valid], dy[valid]], [((V, C), "float32")])
    assert_bits(dt, expected)


# ---- dropout --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p,seed,offset", [(0.1, 0, 0), (0.5, 12345, 7), (0.3, -7, 2**40 + 3), (0.0, 1, 0),
                                           (1.0, 1, 0)])
@pytest.mark.parametrize("rng", [None, "int32", "int64"])
def test_dropout_mask_is_the_cpus(dtype, p, seed, offset, rng):
    x = rand((7, 1029), dtype, 6)  # odd: a partial vector at the end
    r = {None: None, "int32": np.array([0x1234567, -5], np.int32),
         "int64": np.array([-(2**62) + 99], np.int64)}[rng]
    ins = [x] if r is None else [x, r]
    (expected,) = run_op("dropout_fwd", ins, [(x.shape, dtype)], p=p, seed=seed, offset=offset)
    (got,) = run_cuda("dropout_fwd", ins, [(x.shape, dtype)], p=p, seed=seed, offset=offset)
    assert_bits(got, expected)


def test_dropout_in_place():
    x = rand((3, 333), "bfloat16", 7)
    (expected,) = run_op("dropout_fwd", [x], [(x.shape, "bfloat16")], p=0.25, seed=3, offset=11)
    t = cuda(x)
    _native.call_op("dropout_fwd", [t], [t], {"p": 0.25, "seed": 3, "offset": 11})
    assert_bits(host(t), expected)


# ---- global_norm ----------------------------------------------------------------------------

def norm_cuda(xs) -> float:
    out = _native.zeros([1], "float32", "cuda")
    _native.call_op("global_norm", [cuda(x) for x in xs], [out], {})
    return float(host(out)[0])


def test_global_norm_mixed_dtypes_with_an_absent_input():
    rng = np.random.default_rng(8)
    xs = [
        rng.standard_normal((300, 257)).astype(np.float32) * 1e3,
        None,
        as_dtype(rng.standard_normal(70001), "bfloat16"),  # several chunks, a partial last one
        rng.standard_normal((5, 3)).astype(np.float16),
        rng.standard_normal(9),  # float64
    ]
    ref = np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in xs if x is not None))
    got = norm_cuda(xs)
    assert abs(got - ref) <= np.spacing(np.float32(ref))  # within one f32 ulp of the exact value
    cpu = np.zeros(1, np.float32)
    _native.call_op("global_norm", xs, [cpu], {})
    assert_close(got, cpu[0], rtol=1e-6, atol=0)
    assert norm_cuda(xs) == got  # deterministic


def test_global_norm_edge_cases():
    assert norm_cuda([]) == 0.0
    assert norm_cuda([None]) == 0.0
    assert np.isnan(norm_cuda([np.array([1.0, np.nan], np.float32)]))
    many = [np.full(i % 5 + 1, 0.5, np.float32) for i in range(600)]  # more tensors than one launch takes
    ref = np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in many))
    assert abs(norm_cuda(many) - ref) <= np.spacing(np.float32(ref))


# ---- adamw / adamw8 -------------------------------------------------------------------------

LR, B1, B2, EPS, WD = (float(np.float32(v)) for v in (3e-3, 0.9, 0.999, 1e-8, 0.1))
NO_DECAY = [1, 3]
# (shape, param dtype, with master, grad dtype): every storage dtype, master present and absent,
# sizes that end mid-vector, mid-quantization-block and mid-chunk, one spanning several chunks.
GROUPS = [
    ((7,), "float32", False, "float32"),
    ((13, 5), "bfloat16", True, "bfloat16"),
    ((3, 17, 2), "float16", False, "float16"),
    ((1,), "bfloat16", False, "float32"),
    ((40001,), "bfloat16", True, "bfloat16"),
    ((600,), "float32", False, "bfloat16"),
    ((257,), "float16", True, "float32"),
]


def hp(step, max_norm):
    return np.array([LR, B1, B2, EPS, WD, step, max_norm, 0], np.float32)


def init_states(op, groups, seed):
    """Per group the in-place slots (param, master, then m, v or m_q, m_scale, v_q, v_scale)."""
    rng = np.random.default_rng(seed)
    states = []
    for shape, pdt, master, _ in groups:
        w = rng.standard_normal(shape).astype(np.float32)
        n = int(np.prod(shape))
        if op == "adamw":
            moments = [np.zeros(shape, np.float32), np.zeros(shape, np.float32)]
        else:
            nb = (n + 255) // 256
            moments = [np.zeros(n, np.uint8), np.zeros(nb, np.float32), np.zeros(n, np.uint8), np.zeros(nb, np.float32)]
        states.append([as_dtype(w, pdt), w.copy() if master else None, *moments])
    return states


def flat_inputs(states, grads, head):
    ins = list(head)
    for (param, master, *moments), g in zip(states, grads):
        ins += [param, master, g, *moments]
    return ins


def check_steps_against_cpu(op, clip, groups, steps, no_decay):
    """Run `steps` steps on both backends from the same state; after each, every in-place slot
    (param, master, the moments or their codes and scales) must have the CPU's bits."""
    cpu = init_states(op, groups, 9)
    dev = [[cuda(x) for x in grp] for grp in cpu]  # copies, taken before the CPU updates its own
    rng = np.random.default_rng(10)
    max_norm = {"absent": 1.0, "off": 0.0, "clipping": 1.0, "not_clipping": 1e4}[clip]
    for step in range(1, steps + 1):
        grads = [as_dtype(rng.standard_normal(shape).astype(np.float32), gdt) for shape, _, _, gdt in groups]
        norm = None
        if clip != "absent":
            norm = np.zeros(1, np.float32)
            _native.call_op("global_norm", grads, [norm], {})  # one norm for both: clip must not differ
        head = [hp(step, max_norm), norm]
        _native.call_op(op, flat_inputs(cpu, grads, head), [], {"no_decay": no_decay})
        _native.call_op(op, flat_inputs(dev, [cuda(g) for g in grads], [cuda(x) for x in head]), [],
                        {"no_decay": no_decay})
        for gi, (c_grp, d_grp) in enumerate(zip(cpu, dev)):
            for si, (c, d) in enumerate(zip(c_grp, d_grp)):
                if c is not None:
                    assert_bits(host(d), c, f"{op} step {step} group {gi} slot {si}")


@pytest.mark.parametrize("clip", ["absent", "off", "clipping", "not_clipping"])
@pytest.mark.parametrize("op", ["adamw", "adamw8"])
def test_adamw_matches_cpu_bit_for_bit(op, clip):
    check_steps_against_cpu(op, clip, GROUPS, steps=3, no_decay=NO_DECAY)


@pytest.mark.parametrize("op", ["adamw", "adamw8"])
def test_adamw_many_groups(op):
    """More groups than one launch's descriptors: the kernel runs in several launches."""
    rng = np.random.default_rng(11)
    groups = [((int(rng.integers(1, 700)),), "float32" if i % 2 else "bfloat16", i % 3 == 0, "float32")
              for i in range(300)]
    check_steps_against_cpu(op, "clipping", groups, steps=1, no_decay=[0, 299])
