"""weight_gather on the CPU (ZeRO-3): each rank's Program copies the pieces it owns into its
staging buffer and the Program's communicator fills the others from their owners, so every rank
ends with the whole layer; the rank threads run their Programs at once (runs release the GIL)."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from surogate import _native
from surogate.errors import InvalidArgumentError, ShapeError

# A layer of four pieces (bytes at their offsets in the pack), kept by ranks 1, 0, 2, 0; one empty.
OFFSETS, SIZES, OWNERS = [0, 256, 512, 768], [200, 256, 0, (3 << 20) + 5], [1, 0, 2, 0]
PACK = OFFSETS[-1] + SIZES[-1]


def rank_program(rank: int, pieces: dict[int, np.ndarray], staging: np.ndarray):
    p = _native.Program("cpu")
    ins = []
    for i in sorted(pieces):
        ins.append(p.external(f"home.{i}", [SIZES[i]], "uint8"))
        p.bind(ins[-1], pieces[i])
    dst = p.external("slot", [PACK], "uint8")
    p.bind(dst, staging)
    w = p.view("w", dst, [256], OFFSETS[1])  # piece 1, as a parameter bound in the slot reads it
    out = p.buffer("out", [256], "uint8")
    p.op("weight_gather", ins, [dst], {"offsets": OFFSETS, "sizes": SIZES, "owners": OWNERS})
    p.op("copy", [w], [out])
    return p, out


def test_every_rank_ends_with_the_whole_layer():
    rng = np.random.default_rng(0)
    data = [rng.integers(0, 256, n, dtype=np.uint8) for n in SIZES]
    comms = _native.thread_group(3)
    staging = [np.full(PACK, 0xAB, np.uint8) for _ in comms]
    programs = [rank_program(r, {i: data[i] for i in range(4) if OWNERS[i] == r}, staging[r]) for r in range(3)]
    for (p, _), c in zip(programs, comms):
        p.set_communicator(c)
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda pr: pr[0].run(), programs))
    for r, ((p, out), s) in enumerate(zip(programs, staging)):
        for i in range(4):
            np.testing.assert_array_equal(s[OFFSETS[i]:OFFSETS[i] + SIZES[i]], data[i], err_msg=f"rank {r} piece {i}")
        assert (s[200:256] == 0xAB).all()  # the gaps between pieces are left alone
        np.testing.assert_array_equal(p.get(out).numpy(), data[1])
    assert programs[0][0].instr(0) == "weight_gather(home.1, home.3) -> (slot)"


def test_a_program_without_its_communicator_is_refused():
    p, _ = rank_program(0, {1: np.zeros(256, np.uint8), 3: np.zeros(SIZES[3], np.uint8)}, np.zeros(PACK, np.uint8))
    with pytest.raises(InvalidArgumentError, match="weight_gather: the Program has no communicator"):
        p.run()


def test_pieces_must_match_the_ranks_inputs():
    (c0, _) = _native.thread_group(2)
    attrs = {"offsets": [0, 64], "sizes": [64, 64], "owners": [0, 1]}
    p = _native.Program("cpu")
    a = p.external("a", [32], "uint8")
    d = p.external("d", [128], "uint8")
    p.bind(a, np.zeros(32, np.uint8))
    p.bind(d, np.zeros(128, np.uint8))
    p.op("weight_gather", [a], [d], attrs)
    p.set_communicator(c0)
    with pytest.raises(ShapeError, match="input 0 holds 32 bytes, its piece 0 64"):
        p.run()
    q = _native.Program("cpu")
    d = q.external("d", [100], "uint8")
    q.bind(d, np.zeros(100, np.uint8))
    q.op("weight_gather", [], [d], {**attrs, "owners": [1, 1]})
    q.set_communicator(c0)
    with pytest.raises(ShapeError, match="piece 1 .* ends past dst's 100 bytes"):
        q.run()
