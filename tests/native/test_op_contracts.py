"""The op contract table (kernels_native/runtime/op_contracts.cpp) against the backends.

Every op has one contract (arity, optional outputs, doc) that all backends register their kernel
under; each backend says which activation dtypes its kernel runs (supports_op). The CPU backend
is the reference: it has a kernel for every contract. The CUDA side lists the ops it still lacks.
"""

import re
from pathlib import Path

import numpy as np
import pytest

from surogate import _native
from surogate.errors import InvalidArgumentError

FLOATS = ["float32", "bfloat16", "float16"]

# CPU ops with no CUDA kernel yet. Adding a CUDA kernel (or a CPU op) means editing this list.
CUDA_LACKS = {"gguf_quantize", "grad_reduce", "grad_wait"}  # (the grad ops: data parallel runs on CPU ranks only so far)
# Ops whose CUDA kernel runs fewer activation dtypes than the CPU's: op -> the dtypes it lacks.
CUDA_LACKS_DTYPES: dict[str, set[str]] = {}

README_DEV = Path(__file__).resolve().parents[2] / "kernels_native" / "README-dev.md"


def contracts():
    return {c["name"]: c for c in _native.op_contracts()}


def test_contract_names_are_unique():
    names = [c["name"] for c in _native.op_contracts()]
    assert len(names) == len(set(names))


def test_every_cpu_op_has_a_contract_and_every_contract_a_cpu_kernel():
    table = contracts()
    cpu = {op["name"]: op for op in _native.list_ops("cpu")}
    assert sorted(n for n, op in cpu.items() if not op["contracted"]) == []
    assert sorted(set(table) - set(cpu)) == [], "contracts without a CPU kernel"
    for name, op in cpu.items():
        c = table[name]
        for key in ("min_inputs", "max_inputs", "num_outputs", "min_outputs", "doc"):
            assert op[key] == c[key], (name, key)


def test_every_contract_is_in_the_readme_op_table():
    documented = set()
    for line in README_DEV.read_text().splitlines():
        if line.startswith("| `"):
            documented |= set(re.findall(r"`([a-z0-9_]+)`", line.split("|")[1]))
    assert sorted(set(contracts()) - documented) == []


def test_supports_op_on_cpu():
    for name in contracts():
        for dt in FLOATS:
            assert _native.supports_op(name, "cpu", dt), (name, dt)
        assert not _native.supports_op(name, "cpu", "int32"), name
    assert not _native.supports_op("no_such_op", "cpu", "float32")
    assert not _native.supports_op("rmsnorm_fwd", "cuda", "float32") or _native.build_info()["cuda"]


def test_arity_errors_quote_the_contract():
    doc = contracts()["rmsnorm_fwd"]["doc"]
    x = np.ones((2, 4), np.float32)
    with pytest.raises(InvalidArgumentError, match=re.escape(doc)):
        _native.call_op("rmsnorm_fwd", [x], [np.zeros((2, 4), np.float32), np.zeros((2,), np.float32)])
    with pytest.raises(InvalidArgumentError, match="rmsnorm_bwd: output 0 is required but missing"):
        _native.call_op("rmsnorm_bwd", [x, x, np.ones(4, np.float32), np.ones(2, np.float32)], [None, None])


HAS_CUDA = bool(_native.build_info()["cuda"])


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA build")
def test_cuda_ops_have_contracts_and_lack_only_the_listed_ones():
    cpu = {op["name"] for op in _native.list_ops("cpu")}
    cuda = {op["name"]: op for op in _native.list_ops("cuda")}
    assert sorted(n for n, op in cuda.items() if not op["contracted"]) == []
    assert sorted(cpu - set(cuda)) == sorted(CUDA_LACKS)
    cpu_dtypes = {op["name"]: set(op["dtypes"]) for op in _native.list_ops("cpu")}
    lacking = {n: cpu_dtypes[n] - set(op["dtypes"]) for n, op in cuda.items() if cpu_dtypes[n] - set(op["dtypes"])}
    assert lacking == CUDA_LACKS_DTYPES
    for name in cuda:
        for dt in FLOATS:
            assert _native.supports_op(name, "cuda", dt) == (dt in cuda[name]["dtypes"]), (name, dt)
