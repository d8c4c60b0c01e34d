"""weight_fetch / weight_wait on the GPU (cuda/weight_stream.cu) against the CPU: the bytes of a
pinned host buffer land in the device staging buffer before the reader after the wait runs, on
the copy stream, eagerly and replayed from a CUDA graph (the copy a memcpy node of the graph: a
replay after the host buffer changed reads the new bytes); pageable host memory is refused.
Skipped without a CUDA build and a GPU; untested until run on the lent H200."""

import numpy as np
import pytest

from surogate import _native
from surogate.errors import InvalidArgumentError

COVERS = ("weight_fetch", "weight_wait")

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)


def streaming_program(n: int, layers: int = 3):
    """``layers`` layers of n bytes taking turns in two staging buffers, each read (a copy into
    its own output) between its wait and the next fetch into its buffer, as the compiler places
    them (surogate/compile/offload.py)."""
    p = _native.Program("cuda")
    srcs = [p.external(f"src{i}", [n], "uint8", host=True) for i in range(layers)]
    dsts = [p.external(f"dst{i}", [n], "uint8") for i in range(layers)]
    outs = [p.buffer(f"out{i}", [n], "uint8") for i in range(layers)]
    for i in range(min(2, layers)):
        p.op("weight_fetch", [srcs[i]], [dsts[i]])
    for i in range(layers):
        p.op("weight_wait", [dsts[i]], [])
        p.op("copy", [dsts[i]], [outs[i]])
        if i + 2 < layers:
            p.op("weight_fetch", [srcs[i + 2]], [dsts[i + 2]])
    return p, srcs, dsts, outs


@pytest.mark.parametrize("graphs", [False, True])
def test_streamed_bytes_reach_each_reader(graphs):
    n, layers = (8 << 20) + 12, 3
    p, srcs, dsts, outs = streaming_program(n, layers)
    host = [_native.host_empty([n], "uint8", pinned=True) for _ in range(layers)]
    slots = [_native.zeros([n], "uint8", "cuda") for _ in range(2)]
    for i in range(layers):
        p.bind(srcs[i], host[i])
        p.bind(dsts[i], slots[i % 2])
    p.set_graphs(graphs)
    rng = np.random.default_rng(1)
    for step in range(4):  # eager, captured, replayed twice (graphs) or eager throughout
        want = [rng.integers(0, 256, n, dtype=np.uint8) for _ in range(layers)]
        for h, w in zip(host, want):
            h.numpy()[:] = w
        p.run()
        for i in range(layers):
            got = p.get(outs[i]).to("cpu").numpy()
            np.testing.assert_array_equal(got, want[i], err_msg=f"step {step}, layer {i}")
    if graphs:
        assert p.graphs_active and p.num_graphs == 1


def test_pageable_host_memory_is_refused():
    p = _native.Program("cuda")
    src = p.external("src", [64], "uint8", host=True)
    dst = p.external("dst", [64], "uint8")
    p.op("weight_fetch", [src], [dst])
    p.op("weight_wait", [dst], [])
    p.bind(src, np.zeros(64, np.uint8))
    p.bind(dst, _native.zeros([64], "uint8", "cuda"))
    with pytest.raises(InvalidArgumentError, match="not pinned host memory"):
        p.run()
