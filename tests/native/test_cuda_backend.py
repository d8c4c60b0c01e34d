"""Every op the CUDA backend registers, run on the GPU and compared with the CPU backend.

Skipped on machines without a CUDA build and a GPU; run on the lent H200 before resolving
anything that touches kernels_native/cuda.
"""

import ast
from pathlib import Path

import numpy as np
import pytest

from sgtest.ops import argmax_cases, argmax_rows, as_dtype, assert_close, run_op
from surogate import _native

COVERS = ("argmax",)  # compared below, exactly

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)


def run_cuda(name, inputs, out_specs, **attrs):
    ins = [None if x is None else _native.tensor(x).to("cuda") for x in inputs]
    outs = [_native.zeros(list(shape), dtype, "cuda") for shape, dtype in out_specs]
    _native.call_op(name, ins, outs, attrs)
    return [o.to("cpu").numpy() for o in outs]


def rand(shape, dtype, seed=0):
    return as_dtype(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), dtype)


# op -> (input builder(dtype), output specs(dtype), attrs)
CASES = {
    "fill": (lambda dt: [], lambda dt: [((7, 129), dt)], {"value": 1.25}),
    "cast": (lambda dt: [rand((7, 129), dt)], lambda dt: [((7, 129), "float32")], {}),
    "copy": (lambda dt: [rand((7, 129), dt)], lambda dt: [((7, 129), dt)], {}),
    "add": (lambda dt: [rand((7, 129), dt, 1), rand((7, 129), dt, 2)], lambda dt: [((7, 129), dt)],
            {"alpha": 0.5, "beta": -1.5}),
    "scale": (lambda dt: [rand((3, 1000), dt)], lambda dt: [((3, 1000), dt)], {"alpha": -2.0}),
}


def covered_elsewhere() -> set[str]:
    """Ops that the other test_cuda_*.py files compare with the CPU: each names them in COVERS."""
    names: set[str] = set()
    for path in Path(__file__).parent.glob("test_cuda_*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "COVERS" for t in node.targets):
                names |= set(ast.literal_eval(node.value))
    return names


def test_every_cuda_op_has_a_case():
    missing = sorted({op["name"] for op in _native.list_ops("cuda")} - set(CASES) - covered_elsewhere())
    assert not missing, f"CUDA ops without a CPU comparison case: {missing}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("op", sorted(CASES))
def test_cuda_matches_cpu(op, dtype):
    build_inputs, outs, attrs = CASES[op]
    inputs = build_inputs(dtype)
    expected = run_op(op, inputs, outs(dtype), **attrs)
    got = run_cuda(op, inputs, outs(dtype), **attrs)
    for g, e in zip(got, expected):
        assert_close(g.astype(np.float32), e.astype(np.float32), dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_argmax_matches_cpu(dtype):
    x = argmax_cases(dtype)
    (got,) = run_cuda("argmax", [x], [((x.shape[0],), "int32")])
    np.testing.assert_array_equal(got, argmax_rows(x))
    wide = rand((3, 151936), dtype, seed=4)  # a vocabulary-sized row, many threads per row
    (got,) = run_cuda("argmax", [wide], [((3,), "int32")])
    np.testing.assert_array_equal(got, argmax_rows(wide))


def test_round_trip_and_allocator():
    x = rand((1024, 33), "bfloat16")
    t = _native.tensor(x).to("cuda")
    assert t.device == "cuda:0"
    np.testing.assert_array_equal(t.to("cpu").numpy(), x)
    stats = _native.allocator_stats("cuda")
    assert stats["allocated_bytes"] > 0
