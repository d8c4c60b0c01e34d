"""Prometheus metrics: vLLM's names under our ``surogate:`` prefix, labelled by model.

Reusing vLLM's names (serving-protocols.md §4) lets Grafana dashboards and the Kubernetes
inference gateway, which read ``num_requests_waiting`` and ``kv_cache_usage_perc``, port over.
Per-request histograms and counters are observed by the gateway when a request ends; the engine
gauges and its counters are read from ``EngineClient.stats()`` (``EngineStats``, by field name)
at scrape time. One registry per app (never the process-global one), so several apps can live
in one process.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .context import RequestContext
from .models import ModelTable

P = "surogate:"
log = logging.getLogger("surogate.gateway")

_LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
            80.0, 160.0, 640.0, 2560.0)
_TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000)


class Metrics:
    def __init__(self, models: ModelTable):
        self.registry = r = CollectorRegistry()
        m = ["model_name"]
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens processed.", m, registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Tokens generated.", m, registry=r)
        self.request_success = Counter(P + "request_success", "Finished requests, by finish reason.",
                                       [*m, "finished_reason"], registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Time to first token.", m, buckets=_LATENCY,
                              registry=r)
        self.itl = Histogram(P + "inter_token_latency_seconds", "Time between output tokens.", m, buckets=_LATENCY,
                             registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Request latency, arrival to last byte.", m,
                             buckets=_LATENCY, registry=r)
        self.request_prompt_tokens = Histogram(P + "request_prompt_tokens", "Prompt length per request.", m,
                                               buckets=_TOKENS, registry=r)
        self.request_generation_tokens = Histogram(P + "request_generation_tokens", "Tokens generated per request.",
                                                   m, buckets=_TOKENS, registry=r)
        self.request_params_n = Histogram(P + "request_params_n", "The n request parameter.", m,
                                          buckets=(1, 2, 5, 10, 20), registry=r)
        self.request_params_max_tokens = Histogram(P + "request_params_max_tokens", "The max_tokens request parameter.",
                                                   m, buckets=_TOKENS, registry=r)
        # ours: HTTP outcomes, so 4xx / 5xx rates need no log scraping
        self.http_requests = Counter(P + "http_requests", "HTTP requests by route and status.", ["route", "status"],
                                     registry=r)
        r.register(_EngineCollector(models))

    def observe(self, ctx: RequestContext, route: str) -> None:
        self.http_requests.labels(route, str(ctx.status)).inc()
        if ctx.model is None or not ctx.finish_reasons:
            return
        model = ctx.model
        self.prompt_tokens.labels(model).inc(ctx.prompt_tokens)
        self.generation_tokens.labels(model).inc(ctx.completion_tokens)
        for reason in ctx.finish_reasons:
            self.request_success.labels(model, reason).inc()
        if ctx.first_token_at is not None:
            self.ttft.labels(model).observe(ctx.first_token_at - ctx.started)
        itl = self.itl.labels(model)  # one label lookup per request, not per gap
        for gap in ctx.inter_token:
            itl.observe(gap)
        self.e2e.labels(model).observe(ctx.elapsed)
        self.request_prompt_tokens.labels(model).observe(ctx.prompt_tokens)
        self.request_generation_tokens.labels(model).observe(ctx.completion_tokens)
        self.request_params_n.labels(model).observe(ctx.n)
        if ctx.max_tokens is not None:
            self.request_params_max_tokens.labels(model).observe(ctx.max_tokens)

    def render(self) -> tuple[bytes, bytes]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST.encode()


class _EngineCollector:
    """The engine's own numbers, read when Prometheus scrapes."""

    GAUGES = (("num_requests_running", "num_running", "Requests running on the engine."),
              ("num_requests_waiting", "num_waiting", "Requests waiting to be scheduled."),
              ("kv_cache_usage_perc", "kv_usage", "KV-cache usage, 0 to 1."))
    COUNTERS = (("num_preemptions", "num_preemptions", "Preemptions."),
                ("prefix_cache_queries", "prefix_cache_queries", "Prefix-cache lookups, in tokens."),
                ("prefix_cache_hits", "prefix_cache_hits", "Prefix-cache hits, in tokens."),
                ("engine_step_seconds", "step_seconds",
                 "Engine wall time in steps: scheduling, the model, sampling, outputs."),
                ("engine_model_seconds", "model_seconds", "Engine wall time in the model's forward passes."),
                ("spec_decode_num_drafts", "spec_num_drafts", "Speculative decoding: verified drafts."),
                ("spec_decode_num_draft_tokens", "spec_num_draft_tokens", "Speculative decoding: draft tokens."),
                ("spec_decode_num_accepted_tokens", "spec_num_accepted_tokens",
                 "Speculative decoding: accepted draft tokens."),
                ("structured_output_draws_checked", "grammar_checked_rows",
                 "Structured outputs: grammar rows drawn first, then checked against the grammar."),
                ("structured_output_draws_allowed", "grammar_checked_allowed",
                 "Structured outputs: checked draws the grammar allowed as drawn (no mask needed)."),
                ("structured_output_device_masked_rows", "device_masked_rows",
                 "Structured outputs: grammar rows drawn under their mask on the device."))

    def __init__(self, models: ModelTable):
        self.models = models

    def describe(self):
        return []

    def collect(self):
        families = {name: GaugeMetricFamily(P + name, doc, labels=["model_name"]) for name, _, doc in self.GAUGES}
        families.update({name: CounterMetricFamily(P + name, doc, labels=["model_name"])
                         for name, _, doc in self.COUNTERS})
        per_pos = CounterMetricFamily(P + "spec_decode_num_accepted_tokens_per_pos",
                                      "Speculative decoding: accepted draft tokens by position in the draft.",
                                      labels=["model_name", "position"])
        for model in self.models:
            if model.engine is None:
                continue
            try:
                stats = model.engine.stats()
            except Exception:  # a broken engine must not break the scrape of the others
                log.exception("engine stats for %s failed", model.name)
                continue
            for name, field, _ in (*self.GAUGES, *self.COUNTERS):
                families[name].add_metric([model.name], float(getattr(stats, field)))
            for pos, n in enumerate(stats.spec_accepted_per_pos):
                per_pos.add_metric([model.name, str(pos)], float(n))
        yield from families.values()
        yield per_pos
