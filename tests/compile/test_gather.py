"""The ZeRO-3 gather pass (surogate/compile/gather.py) on hand-made lowered Programs: where the
gathers go (each phase gathers a layer before its first reader unless its staging buffer still
holds it from earlier in the phase), what becomes of the phases, and the refusals."""

import pytest

from surogate.compile.buffers import Buf, Instr
from surogate.compile.gather import HOME_NAME, gather_weights, pack
from surogate.compile.lower import Lowered
from surogate.errors import InvalidArgumentError, UnsupportedError


def program(reads: list[list[int]], phases: dict[str, tuple[int, int]]):
    """Instructions each reading layer k's weight ``layers.k.w`` (a view of it for layer 1)."""
    bufs, by_value = [], {}
    for k in range(3):
        b = Buf(f"layers.{k}.w", (4, 4), "float32", "external")
        bufs.append(b)
        by_value[b.name] = b
    row = Buf("layers.1.w.row", (16,), "float32", "view", base=by_value["layers.1.w"])
    bufs.append(row)
    instrs = [Instr("op", [row if k == 1 else by_value[f"layers.{k}.w"] for k in ks], [], node=f"i{i}")
              for i, ks in enumerate(reads)]
    layers = [pack(k, [(f"layers.{k}.w", (4, 4), "float32", 64, k % 2)]) for k in range(3)]
    return Lowered(instrs, bufs, by_value, phases=phases), layers


def ops(lw: Lowered, begin=0, end=None):
    return [("gather " + i.node.split()[1] if i.op == "weight_gather" else i.node) for i in lw.instrs[begin:end]]


def test_forward_and_backward_gather_each_layer_once_in_its_order():
    lw, layers = program([[0], [0], [1], [2], [2], [1], [1], [0]], {"forward": (0, 4), "backward": (4, 8)})
    gather_weights(lw, layers, rank=0, params={f"layers.{k}.w" for k in range(3)})
    f, b = lw.phases["forward"], lw.phases["backward"]
    assert ops(lw, *f) == ["gather layers.0", "i0", "i1", "gather layers.1", "i2", "gather layers.2", "i3"]
    # layer 2 is still in its buffer from the forward, but a phase assumes nothing at its start
    assert ops(lw, *b) == ["gather layers.2", "i4", "gather layers.1", "i5", "i6", "gather layers.0", "i7"]
    g = lw.instrs[0]
    assert g.attrs == {"offsets": [0], "sizes": [64], "owners": [0]} and [x.name for x in g.inputs] == \
        [HOME_NAME.format("layers.0.w")]
    assert lw.instrs[3].op == "weight_gather" and lw.instrs[3].inputs == []  # rank 0 keeps no piece of layer 1
    assert lw.instrs[0].outputs[0].base is lw.instrs[5].outputs[0].base  # layers 0 and 2: staging buffer 0


def test_a_layer_read_again_after_the_other_buffer_was_used_is_not_gathered_twice():
    lw, layers = program([[0], [1], [0], [1]], {"forward": (0, 4)})
    gather_weights(lw, layers, rank=1, params={f"layers.{k}.w" for k in range(3)})
    assert ops(lw) == ["gather layers.0", "i0", "gather layers.1", "i1", "i2", "i3"]


def test_two_layers_of_one_buffer_in_one_instruction_are_refused():
    lw, layers = program([[0, 2]], {"forward": (0, 1)})
    with pytest.raises(UnsupportedError, match="reads the weights of layers 0 and 2"):
        gather_weights(lw, layers, rank=0, params={f"layers.{k}.w" for k in range(3)})


def test_a_layer_weight_outside_the_split_is_refused():
    lw, layers = program([[0]], {"forward": (0, 1)})
    with pytest.raises(InvalidArgumentError, match="reads layers.2.w, which no sharded layer holds"):
        gather_weights(lw, layers[:2], rank=0, params={f"layers.{k}.w" for k in range(3)})
