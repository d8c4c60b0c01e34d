"""The weight streaming ops on the CPU (weight_fetch: host buffer -> staging buffer; weight_wait)
and what serving with weights in host memory needs from the module: host-resident Program
externals, host_empty, Tensor.view (a parameter bound at its offset in a staging buffer)."""

import ml_dtypes
import numpy as np
import pytest

from surogate import _native
from surogate.errors import InvalidArgumentError, ShapeError


def test_fetch_copies_the_bytes_and_wait_orders_the_reader_after_it():
    n = 3 << 20  # several of the CPU kernel's 1 MiB chunks, and a tail
    host = np.random.default_rng(0).integers(0, 256, n + 7, dtype=np.uint8)
    p = _native.Program()
    src = p.external("src", [n + 7], "uint8", host=True)
    dst = p.external("dst", [n + 7], "uint8")
    w = p.view("w", dst, [4, 8])  # bytes 0..31: what a parameter bound in the buffer reads
    out = p.buffer("out", [4, 8], "uint8")
    p.op("weight_fetch", [src], [dst])
    p.op("weight_wait", [dst], [])
    p.op("copy", [w], [out])
    staging = np.zeros(n + 7, np.uint8)
    p.bind(src, host)
    p.bind(dst, staging)
    p.run()
    np.testing.assert_array_equal(staging, host)
    np.testing.assert_array_equal(p.get(out).numpy().ravel(), host[:32])
    assert p.instr(0) == "weight_fetch(src) -> (dst)" and p.instr(1) == "weight_wait(dst) -> ()"


def test_fetch_refuses_buffers_of_other_sizes():
    with pytest.raises(ShapeError, match="weight_fetch: src holds 16 bytes, dst 8"):
        _native.call_op("weight_fetch", [np.zeros(16, np.uint8)], [np.zeros(8, np.uint8)], {})


def test_a_host_external_binds_host_memory():
    p = _native.Program("cpu")
    h = p.external("h", [4], "uint8", host=True)
    p.bind(h, np.zeros(4, np.uint8))  # on the CPU, host memory is the device's
    with pytest.raises(ShapeError):
        p.bind(h, np.zeros(5, np.uint8))


def test_host_empty_is_aligned_host_memory_and_pinned_needs_a_gpu():
    t = _native.host_empty([1000], "uint8")
    assert t.device == "cpu" and t.shape == (1000,) and t.data_ptr % 64 == 0
    a = t.numpy()
    a[:] = 7
    assert int(a.sum()) == 7000
    if not (_native.build_info()["cuda"] and _native.cuda_devices()):
        with pytest.raises(Exception, match="pinned host memory needs the CUDA backend"):
            _native.host_empty([16], "uint8", pinned=True)
    with pytest.raises(InvalidArgumentError, match="negative"):
        _native.host_empty([-1], "uint8")


def test_tensor_view_reinterprets_bytes_at_an_offset():
    buf = _native.host_empty([1024], "uint8")
    raw = buf.numpy()
    w = np.arange(12, dtype=np.float32).reshape(3, 4).astype(ml_dtypes.bfloat16)
    raw[256:256 + w.nbytes] = w.view(np.uint8).ravel()
    v = buf.view("bfloat16", [3, 4], 256)
    assert (v.dtype, v.shape, v.data_ptr - buf.data_ptr) == ("bfloat16", (3, 4), 256)
    np.testing.assert_array_equal(v.numpy(), w)
    v.numpy()[0, 0] = 5  # a view: the same memory
    assert raw[256:258].view(ml_dtypes.bfloat16)[0] == 5
    for dtype, shape, offset in [("float32", [256], 4), ("float32", [4], 2), ("uint8", [4], -1)]:
        with pytest.raises(InvalidArgumentError, match="view"):
            buf.view(dtype, shape, offset)
