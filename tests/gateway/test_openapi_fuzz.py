"""schemathesis against our own /openapi.json, on a real server with a tiny model: every
operation, a bounded number of generated requests each (derandomized, so a failure reproduces),
checking that nothing is a 5xx, that every status and body is one the document declares, and
that bodies match their schemas (success and error envelopes alike)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("granian")
schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sgtest.server import surogate_serve  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402

KEY = "sk-fuzz"
EXAMPLES = int(os.environ.get("SUROGATE_FUZZ_EXAMPLES", "25"))  # per operation; about 20 s on two shared cores
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = make_qwen3(tmp_path_factory.mktemp("qwen3_fuzz"), seed=3)
    # a small context keeps the longest generated answer short
    with surogate_serve(f"tiny={path}", "--kv-cache-tokens", "1024", "--max-model-len", "128",
                        "--api-key", KEY) as base:
        yield base


def _served_model(case):
    """Name the served model (with a random name every request would stop at the 404 for it), and
    keep answers short (most random lengths overflow the context: a 400 before any generation)."""
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = "tiny"
        for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            if isinstance(case.body.get(field), int) and case.body[field] > 16:
                case.body[field] = 16
    return case


def test_every_operation_conforms_to_the_schema(server):
    schema = schemathesis.openapi.from_url(f"{server}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    from surogate.gateway.app import ROUTES

    # schemathesis leaves out the document's own path
    assert {op.label for op in operations} == {f"{r.method} {r.path}" for r in ROUTES} - {"GET /openapi.json"}
    failures = {}
    for op in operations:
        @hypothesis.settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                             suppress_health_check=list(hypothesis.HealthCheck),
                             phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate])
        @hypothesis.given(case=op.as_strategy().map(_served_model))
        def run(case):
            case.call_and_validate(base_url=server, headers={"Authorization": f"Bearer {KEY}"}, checks=CHECKS,
                                   timeout=30)

        try:
            run()
        except Exception as e:  # collect all operations' failures, then report them together
            failures[op.label] = f"{type(e).__name__}: {e}"[:3000]
    assert not failures, "\n\n".join(f"{label}:\n{text}" for label, text in failures.items())
