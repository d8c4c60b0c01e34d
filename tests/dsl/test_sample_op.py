"""ops.sample in a compiled graph: the node lowers (its rank output optional), runs on the CPU and
gives the numpy reference's tokens and raw logprobs; autodiff refuses it with a reason."""

from __future__ import annotations

import numpy as np
import pytest

from sgtest import sampling as ref
from surogate.autodiff import backward
from surogate.compile import Executable
from surogate.dsl import Graph, ops
from surogate.errors import UnsupportedError


@pytest.mark.parametrize("with_rank", [True, False])
def test_a_graph_with_a_sample_node_gives_the_reference_tokens(with_rank):
    R, V = 6, 257
    x = np.random.default_rng(1).standard_normal((R, V)).astype(np.float32) * 2
    knobs = dict(temperature=0.8, top_k=30, top_p=0.9)
    p = ref.params(R, seed=np.arange(R) + 100, step=3, **knobs)
    p[0, 0] = 0.0  # a greedy row beside the sampled ones
    g = Graph("t")
    logits, params = g.input("logits", (R, V), "float32"), g.input("sample_params", (R, 8), "float32")
    tok, lp, rank = ops.sample(logits, params, rank=with_rank)
    assert (rank is None) != with_rank
    exe = Executable(g, {}, keep=[v for v in (tok, lp, rank) if v is not None])
    exe.bind("logits", x)
    exe.bind("sample_params", p)
    exe.run()
    got = exe.read(tok.name)
    want = [int(np.argmax(x[0]))] + [ref.token(x[r], 100 + r, 3, **knobs) for r in range(1, R)]
    assert got.tolist() == want
    np.testing.assert_allclose(exe.read(lp.name), ref.log_softmax(x)[np.arange(R), want], rtol=1e-5, atol=1e-5)
    if with_rank:
        assert exe.read(rank.name).tolist() == [ref.rank(x[r], want[r]) for r in range(R)]


def test_sample_checks_its_params_and_has_no_derivative():
    g = Graph("t")
    w = g.param("w", (4, 10), "float32")
    with pytest.raises(ValueError, match=r"params float32\[4, 7\] must be float32 \[4, 8\]"):
        ops.sample(w, g.input("bad", (4, 7), "float32"))
    tok, lp, _ = ops.sample(w, g.input("sample_params", (4, 8), "float32"))
    with pytest.raises(UnsupportedError, match="sample draws token ids"):
        backward(g, lp, seed_name="dy")
