"""bench serve --speculative-method: the plain and speculative runs of one prompt set give the
same greedy tokens and an acceptance figure from the engine's counters."""

import surogate
from sgtest.engine import prompts
from sgtest.tiny_models import make_model
from surogate.bench.serve import bench_speculative_one


def test_plain_and_speculative_runs_agree_and_report_acceptance(tmp_path):
    model = surogate.load_model(make_model("llama", tmp_path, seed=21, initializer_range=0.2))
    ps = [(p * 3)[:30] for p in prompts(model.spec.vocab_size, 3, seed=4)]
    plain = bench_speculative_one(model, ps, 8, None)
    spec = bench_speculative_one(model, ps, 8, {"speculative_method": "ngram", "num_speculative_tokens": 3,
                                                "prompt_lookup_min": 1, "prompt_lookup_max": 2})
    assert sorted(spec.tokens) == sorted(plain.tokens) and all(len(t) == 8 for t in spec.tokens)
    assert plain.acceptance is None and spec.acceptance is not None and 0 <= spec.acceptance <= 1
    assert spec.single_stream_tokens_per_s > 0 and spec.name == "ngram k=3"
