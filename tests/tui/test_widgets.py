"""The pieces with no screen around them: the braille line plot, Prometheus text as the Serve
screen reads it, the request-log line, and the settings file."""

from __future__ import annotations

import pytest
from rich.text import Text

from surogate.errors import ConfigError
from surogate.tui.gateway_client import parse_prometheus
from surogate.tui.settings import Settings
from surogate.tui.widgets.line_plot import draw


def render_plot(series: dict, size=(30, 6)) -> list[str]:
    return str(draw({name: (pts, "cyan") for name, pts in series.items()}, *size)).splitlines()


def test_line_plot_draws_a_falling_line_with_its_range():
    lines = render_plot({"loss": [(1, 4.0), (2, 3.0), (3, 2.0), (4, 1.0)]})
    assert len(lines) == 6
    assert lines[0].startswith("4.15┤") and lines[4].startswith("0.85┤")  # 5% headroom
    assert lines[-1].strip().startswith("└1") and lines[-1].rstrip().endswith("4") and "● loss" in lines[-1]
    cells = [line[5:] for line in lines[:5]]
    first = [next(i for i, c in enumerate(row) if c != " ") for row in cells if row.strip()]
    assert first == sorted(first)  # the line goes down and to the right


def test_line_plot_empty_and_constant():
    assert render_plot({}) == ["no points yet"]
    lines = render_plot({"loss": [(1, 2.0), (2, 2.0)]})
    assert lines[0].startswith("2.5┤") and lines[4].startswith("1.5┤")


def test_prometheus_text_summed_over_labels():
    text = """# HELP surogate:generation_tokens_total Tokens generated.
# TYPE surogate:generation_tokens_total counter
surogate:generation_tokens_total{model_name="a"} 10.0
surogate:generation_tokens_total{model_name="b b"} 5.0
surogate:kv_cache_usage_perc{model_name="a"} 0.25
surogate:request_success_total{model_name="a",finished_reason="stop"} 3.0 1700000000
surogate:e2e_request_latency_seconds_bucket{le="+Inf",model_name="a"} 3.0
weird NaN
"""
    m = parse_prometheus(text)
    assert m["surogate:generation_tokens"] == 15.0 and m["surogate:kv_cache_usage_perc"] == 0.25
    assert m["surogate:request_success"] == 3.0 and "weird" not in m


def test_request_log_lines():
    from surogate.tui.screens.serve import format_log_line

    line = ('{"request_id":"r1","method":"POST","path":"/v1/chat/completions","status":200,"ms":40.4,'
            '"model":"tiny","stream":true,"prompt_tokens":84,"completion_tokens":12,"ttft_ms":9.6}')
    assert str(format_log_line(line)) == "200 POST /v1/chat/completions  tiny  84→12 tok  40 ms  ttft 10 ms"
    assert format_log_line('{"method":"GET","path":"/health","status":200,"ms":1}') is None  # our own polling
    assert isinstance(format_log_line("[INFO] Listening at: http://127.0.0.1:8000"), Text)


def test_settings_round_trip_and_errors(tmp_path):
    s = Settings.load(tmp_path)
    assert s.model_folders == ["output"] and s.serve_port == 8000 and not s.path.exists()
    s.model_folders = ["output", "~/models with space", 'a"quote']
    s.serve_port = 9000
    s.save()
    again = Settings.load(tmp_path)
    assert again.model_folders == s.model_folders and again.serve_port == 9000
    (tmp_path / "settings.toml").write_text("model_folder = ['x']\n")
    with pytest.raises(ConfigError, match="unknown key 'model_folder'"):
        Settings.load(tmp_path)
    (tmp_path / "settings.toml").write_text("serve_port = 'eighty'\n")
    with pytest.raises(ConfigError, match="serve_port must be an integer"):
        Settings.load(tmp_path)
