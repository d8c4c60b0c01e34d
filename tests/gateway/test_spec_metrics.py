"""/metrics' speculative-decoding counters: vLLM's spec_decode names under our prefix, read from
the engine's stats, per model and (accepted tokens) per draft position."""

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from surogate.gateway.metrics import _EngineCollector
from surogate.serve.types import EngineStats


def test_spec_decode_counters_follow_the_engine_stats():
    stats = EngineStats(num_running=1, num_waiting=0, num_blocks=8, blocks_used=1, blocks_free=7, blocks_cached=0,
                        kv_usage=0.125, prefix_cache_queries=0, prefix_cache_hits=0, prompt_tokens=10,
                        generation_tokens=40, num_preemptions=0, num_steps=12, num_finished=1, step_seconds=1.0,
                        model_seconds=0.5, last_error=None, spec_num_drafts=9, spec_num_draft_tokens=36,
                        spec_num_accepted_tokens=25, spec_accepted_per_pos=[9, 7, 5, 4])
    model = SimpleNamespace(name="smol", engine=SimpleNamespace(stats=lambda: stats))
    r = CollectorRegistry()
    r.register(_EngineCollector([model]))
    text = generate_latest(r).decode()
    assert 'surogate:spec_decode_num_drafts_total{model_name="smol"} 9.0' in text
    assert 'surogate:spec_decode_num_draft_tokens_total{model_name="smol"} 36.0' in text
    assert 'surogate:spec_decode_num_accepted_tokens_total{model_name="smol"} 25.0' in text
    assert 'surogate:spec_decode_num_accepted_tokens_per_pos_total{model_name="smol",position="2"} 5.0' in text
