"""Weight streaming: a serving graph some of whose decoder layers keep their weights in host memory.

The serving runner (surogate/serve/offload.py) packs each streamed layer's weights into one host
buffer and keeps two device staging buffers; the streamed layers take turns in them (the k-th
streamed layer in buffer k % 2), and each of its parameters is bound to its bytes in its buffer.
`stream_weights` puts the copies into the graph, for the k-th streamed layer (index i):

- ``weight_fetch(offload.layers.{i}.host) -> (offload.layers.{i}.dst)`` right after the last node
  that reads layer k - 2's weights (the layer that held the buffer before), or first of all for
  the first two: so the copy of layer k overlaps the nodes from there to layer k, layer k - 1
  (in the other buffer) among them;
- ``weight_wait(offload.layers.{i}.dst)`` right before the first node that reads layer k's
  weights.

``dst`` is the staging buffer's first bytes (layer k's packed size); ``host`` a host buffer
(``meta["host"]``: bound to host memory on any device). At one place the fetches come before
the waits. The nodes keep their order (the lowering keeps it too), which is all the ordering the
device needs: cuda/weight_stream.cu orders the copy after the work queued before the fetch and
the work after the wait behind the copy.

A layer's weights must be read by nodes that come after every node reading the weights of the
streamed layer two before it; a graph where they interleave (weights shared across layers, say)
cannot take turns in two buffers and is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from surogate.dsl import ops
from surogate.dsl.graph import Graph, Node
from surogate.errors import InvalidArgumentError, UnsupportedError

SLOTS = 2  # staging buffers: the layer being computed, the next one on its way


@dataclass(frozen=True)
class StreamedLayer:
    index: int  # the decoder layer
    params: tuple[str, ...]  # its parameters bound inside its staging buffer
    nbytes: int  # its packed size

    @property
    def host_name(self) -> str:
        return f"offload.layers.{self.index}.host"

    @property
    def dst_name(self) -> str:
        return f"offload.layers.{self.index}.dst"


def stream_weights(g: Graph, layers: list[StreamedLayer], flag: str = "weight streaming") -> Graph:
    """Add the fetches and waits of `layers` (in layer order) to the serving graph `g` in place
    (and return it). ``flag`` names the option that asked for it, in errors."""
    if not layers:
        return g
    owner = {name: k for k, layer in enumerate(layers) for name in layer.params}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for at, n in enumerate(g.nodes):
        for v in n.inputs:
            k = owner.get(v.name) if v is not None and v.kind == "param" else None
            if k is not None:
                first.setdefault(k, at)
                last[k] = at
    for k, layer in enumerate(layers):
        if k not in first:
            raise InvalidArgumentError(f"{flag}: no node of {g.name} reads the weights of layer {layer.index}",
                                       hint="the streamed layers' parameters come from another build of the model")
    for k in range(SLOTS, len(layers)):
        if last[k - SLOTS] >= first[k]:
            before = layers[k - SLOTS].index
            raise UnsupportedError(
                f"{flag}: in {g.name} layer {layers[k].index}'s weights are read (node {first[k]}) before the last "
                f"node reading layer {before}'s (node {last[k - SLOTS]}), so the two cannot take turns in one "
                "staging buffer", hint=f"serve this model without {flag}")
    fetches: dict[int, list[Node]] = {}  # node index -> the nodes to put before it
    waits: dict[int, list[Node]] = {}
    for k, layer in enumerate(layers):
        host = g.param(layer.host_name, (layer.nbytes,), "uint8", trainable=False, host=True)
        dst = g.param(layer.dst_name, (layer.nbytes,), "uint8", trainable=False)
        start = len(g.nodes)
        ops.weight_fetch(host, dst)
        ops.weight_wait(dst)
        fetch, wait = g.pop_nodes(start)
        fetches.setdefault(last[k - SLOTS] + 1 if k >= SLOTS else 0, []).append(fetch)
        waits.setdefault(first[k], []).append(wait)
    nodes: list[Node] = []
    for at, n in enumerate(g.nodes):
        nodes += fetches.get(at, []) + waits.get(at, [])
        nodes.append(n)
    g.nodes = nodes
    return g
