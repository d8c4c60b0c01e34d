"""The gradient reduction pass (surogate/compile/grad_reduce.py) on hand-made lowered Programs:
each layer's grad_reduce right after the last backward instruction touching its accumulators, a
group per parameter outside the layers, untouched accumulators first, grad_wait closing the
backward, the phases after it shifted, owners per accumulator under ZeRO-2/3."""

import pytest

from surogate.compile.buffers import Buf, Instr
from surogate.compile.grad_reduce import reduce_gradients
from surogate.compile.lower import Lowered
from surogate.errors import InvalidArgumentError

PARAMS = ["embed.w", "layers.0.a", "layers.0.b", "layers.1.a", "layers.1.b", "head.w", "norm.w"]


def program(writes: list[list[str]], phases: dict[str, tuple[int, int]]):
    """Instruction i writes the accumulators ``writes[i]`` (layers.0.b's through a view)."""
    bufs, by_value = [], {}
    for n in PARAMS:
        b = Buf("grad." + n, (4,), "float32", "external")
        bufs.append(b)
        by_value[b.name] = b
    view = Buf("grad.layers.0.b.half", (2,), "float32", "view", base=by_value["grad.layers.0.b"])
    bufs.append(view)
    instrs = [Instr("op", [], [view if n == "layers.0.b" else by_value["grad." + n] for n in ns], node=f"i{i}")
              for i, ns in enumerate(writes)]
    return Lowered(instrs, bufs, by_value, phases=phases)


def listing(lw: Lowered, begin=0, end=None):
    out = []
    for ins in lw.instrs[begin:end]:
        if ins.op == "grad_reduce":
            out.append("reduce " + ",".join(b.name[len("grad."):] for b in ins.inputs))
        else:
            out.append(ins.op if ins.op == "grad_wait" else ins.node)
    return out


# forward i0; backward i1..i6: head, layer 1, layer 0 (its b twice, once through a view), embed.
BACKWARD = [[], ["head.w"], ["layers.1.a"], ["layers.1.b"], ["layers.0.b"], ["layers.0.a"], ["layers.0.b"],
            ["embed.w"], []]


def test_each_group_goes_after_its_last_writer_and_the_wait_ends_the_backward():
    lw = program(BACKWARD, {"forward": (0, 1), "backward": (1, 9)})
    groups = reduce_gradients(lw)
    assert listing(lw) == ["i0", "reduce norm.w",  # never written: final from the start
                           "i1", "reduce head.w", "i2", "i3", "reduce layers.1.a,layers.1.b", "i4", "i5", "i6",
                           "reduce layers.0.a,layers.0.b", "i7", "reduce embed.w", "i8", "grad_wait"]
    assert lw.phases == {"forward": (0, 1), "backward": (1, 15)}
    assert [(g.tag, g.names, g.owners) for g in groups] == [
        (-1, ("norm.w",), None), (-1, ("head.w",), None), (1, ("layers.1.a", "layers.1.b"), None),
        (0, ("layers.0.a", "layers.0.b"), None), (-1, ("embed.w",), None)]
    r = lw.instrs[6]
    assert r.attrs == {"tag": 1} and r.outputs == []  # (no owners: an all-reduce)


def test_a_reader_keeps_the_group_waiting_and_later_phases_shift():
    # i5 reads head.w's accumulator after the layers' backward: head.w is reduced after i5 only.
    writes = [[], ["head.w"], ["layers.1.a", "layers.1.b"], ["layers.0.a", "layers.0.b"], ["embed.w"], [], []]
    lw = program(writes, {"forward": (0, 1), "backward": (1, 6), "optimizer": (6, 7)})
    lw.instrs[5].inputs = [lw.by_value["grad.head.w"]]  # a late reader of head.w's accumulator
    reduce_gradients(lw, owners={n: k % 2 for k, n in enumerate(PARAMS)})
    b = lw.phases["backward"]
    assert listing(lw, *b)[-3:] == ["i5", "reduce head.w", "grad_wait"]
    assert lw.phases["optimizer"] == (b[1], b[1] + 1) and listing(lw, *lw.phases["optimizer"]) == ["i6"]
    layer1 = next(i for i in lw.instrs if i.op == "grad_reduce" and i.attrs["tag"] == 1)
    assert layer1.attrs["owners"] == [1, 0]  # layers.1.a, layers.1.b: owners by name


def test_refusals():
    with pytest.raises(InvalidArgumentError, match="no backward phase"):
        reduce_gradients(program(BACKWARD, {"forward": (0, 9)}))
    with pytest.raises(InvalidArgumentError, match="no owner for norm.w"):
        reduce_gradients(program(BACKWARD, {"forward": (0, 1), "backward": (1, 9)}), owners={"embed.w": 0})


def test_sharded_layers_are_staged_and_a_buffer_waits_for_its_last_layer():
    bufs, by_value = [], {}
    for n in ["layers.0.w", "layers.1.w", "layers.2.w", "layers.2.v", "head.w"]:
        b = Buf("grad." + n, (64,), "float32", "external")
        bufs.append(b)
        by_value[b.name] = b
    writes = [[], ["head.w"], ["layers.2.w", "layers.2.v"], ["layers.1.w"], ["layers.0.w"]]
    lw = Lowered([Instr("op", [], [by_value["grad." + n] for n in ns], node=f"i{i}") for i, ns in enumerate(writes)],
                 bufs, by_value, phases={"forward": (0, 1), "backward": (1, 5)})
    owners = {"layers.0.w": 1, "layers.1.w": 0, "layers.2.w": 1, "layers.2.v": 1, "head.w": 1}
    groups = reduce_gradients(lw, owners, stage_rank=0)
    waits = [(i.node, i.attrs) for i in lw.instrs if i.op == "grad_wait"]
    assert waits == [("data parallel: layers.2's staged gradients reduced", {"tag": 2}),
                     ("data parallel: the gradients reduced", {})]
    assert listing(lw, *lw.phases["backward"]) == [
        "i1", "reduce head.w", "i2", "reduce layers.2.w,layers.2.v", "i3", "reduce layers.1.w", "grad_wait", "i4",
        "reduce layers.0.w", "grad_wait"]
    by_tag = {g.tag: g for g in groups}
    # rank 0 owns layers.1.w only: layer 2's two tensors packed (256-byte aligned) in buffer 0, layer 0's there too
    assert by_tag[2].staged == (("layers.2.w", 0, 0), ("layers.2.v", 0, 256)) and by_tag[0].staged == (
        ("layers.0.w", 0, 0),)
    assert by_tag[1].staged == () and by_tag[-1].staged == ()  # (its own; outside the layers: whole)
    staged = [i for i in lw.instrs if i.op == "grad_reduce" and i.attrs.get("every")]
    assert [i.attrs["tag"] for i in staged] == [2, 0]
