"""weight_gather on GPUs (cuda/weight_gather.cu) against the CPU reference (cpu/weight_gather.cpp):
one rank per GPU (up to two) over the NCCL backend, each rank's Program copying its pieces into
its staging buffer and the communicator filling the others; every rank ends with the layer the
CPU ranks end with. Skipped without a CUDA build with NCCL and a GPU; untested until run on a
lent GPU (ZeRO-3's GPU ranks are not wired into the trainer yet)."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from surogate import _native

COVERS = ("weight_gather",)

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

OFFSETS, SIZES = [0, 256, 768], [200, 500, (1 << 20) + 3]
PACK = OFFSETS[-1] + SIZES[-1]


def run_ranks(backend: str, comms, owners, data):
    def rank(r):
        device = "cpu" if backend == "cpu" else f"cuda:{r}"  # (NCCL: rank r on GPU r)
        p = _native.Program(device)
        ins = []
        for i in (i for i in range(len(SIZES)) if owners[i] == r):
            ins.append(p.external(f"home.{i}", [SIZES[i]], "uint8"))
            p.bind(ins[-1], _native.tensor(data[i]).to(device) if device != "cpu" else data[i])
        dst = p.external("slot", [PACK], "uint8")
        slot = np.zeros(PACK, np.uint8)
        p.bind(dst, _native.tensor(slot).to(device) if device != "cpu" else slot)
        p.op("weight_gather", ins, [dst], {"offsets": OFFSETS, "sizes": SIZES, "owners": owners})
        p.set_communicator(comms[r])
        p.run()
        got = p.get(dst)
        return got.numpy() if device == "cpu" else got.to("cpu").numpy()

    with ThreadPoolExecutor(len(comms)) as pool:
        return list(pool.map(rank, range(len(comms))))


def test_every_gpu_rank_ends_with_the_cpu_ranks_layer():
    try:
        gpus = _native.nccl_group(list(range(min(2, len(_native.cuda_devices())))))
    except Exception as e:  # (built without NCCL)
        pytest.skip(str(e))
    world = len(gpus)
    owners = [k % world for k in range(len(SIZES))]
    rng = np.random.default_rng(0)
    data = [rng.integers(0, 256, n, dtype=np.uint8) for n in SIZES]
    want = run_ranks("cpu", _native.thread_group(world), owners, data)
    got = run_ranks("cuda", gpus, owners, data)
    for r in range(world):
        np.testing.assert_array_equal(got[r], want[r], err_msg=f"rank {r}")
