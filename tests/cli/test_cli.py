"""The `surogate` command as a user runs it: a fresh process, its exit status, stdout and stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import surogate
from surogate import _native
from surogate.cli import doctor

NOT_BUILT: dict[str, list[str]] = {}  # every command is built
COMMANDS = [*NOT_BUILT, "grpo", "bench", "doctor", "merge", "sft", "pt", "dpo", "distill", "serve", "quantize", "models", "tui"]


def run(*args: str, code: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """`surogate ARGS...`, or a Python snippet that sets the CLI up before calling main()."""
    # -P: the surogate on PYTHONPATH or installed, not the source tree in the current directory.
    cmd = [sys.executable, "-P", *(["-c", code] if code else ["-m", "surogate.cli.main"]), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def test_help_lists_every_command_in_its_panel() -> None:
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    for panel in ("Train", "Serve", "Models", "Tools"):
        assert panel in proc.stdout
    listed = {line.strip("│ ").split(" ")[0] for line in proc.stdout.splitlines()}
    assert set(COMMANDS) <= listed, proc.stdout


def test_no_arguments_shows_help() -> None:
    proc = run()
    assert proc.returncode == 2
    assert "doctor" in proc.stdout + proc.stderr


def test_version() -> None:
    proc = run("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"surogate {surogate.__version__}\n"


def test_doctor_text_report() -> None:
    proc = run("doctor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    keys = [line.split("  ")[0].strip() for line in proc.stdout.splitlines() if line[:1] != " "]
    for key in ("surogate", "python", "platform", "native", "cpu", "cpu features", "threads", "cuda devices",
                "extras"):
        assert key in keys, proc.stdout
    assert surogate.__version__ in proc.stdout


def test_doctor_json_report() -> None:
    proc = run("doctor", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert set(report) == {"surogate", "python", "platform", "native", "cpu", "threads", "cuda_devices", "extras"}
    assert report["surogate"]["version"] == surogate.__version__
    assert report["native"]["error"] is None
    assert {"compiler", "blas", "cuda"} <= set(report["native"]["build"])
    assert {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"} <= set(report["cpu"]["features"])
    assert report["cpu"]["logical_cpus"] >= 1 and report["threads"] >= 1
    assert isinstance(report["cuda_devices"], list)
    assert set(report["extras"]) == {"textual", "granian", "wandb", "torch"}


# Hide the native module the way a wheel for another Python or a missing build would.
WITHOUT_NATIVE = (
    "import sys\nsys.modules['surogate._native'] = None\nfrom surogate.cli.main import main\nmain(sys.argv[1:])"
)


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_doctor_reports_a_missing_native_module(as_json: bool) -> None:
    proc = run("doctor", *(["--json"] if as_json else []), code=WITHOUT_NATIVE)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    if as_json:
        report = json.loads(proc.stdout)
        assert "surogate._native" in report["native"]["error"]
        assert ".ci/build-dev" in report["native"]["hint"]
        assert report["cpu"] is None and report["cuda_devices"] is None
    else:
        assert "import failed" in proc.stdout and "hint" in proc.stdout
        assert "python" in proc.stdout and "extras" in proc.stdout


def test_doctor_lists_cuda_devices() -> None:
    report = doctor.collect()
    if report["native"]["error"]:
        pytest.skip("the native module does not import")
    report["native"]["build"].update(cuda=True, cuda_archs="90a", cuda_runtime_version="13.0")
    report["cuda_devices"] = [
        {"index": i, "name": "NVIDIA H200", "compute_capability": (9, 0), "total_memory": 141 * 2**30,
         "multiprocessors": 132, "driver_version": "13.0"}
        for i in range(2)
    ]
    lines = doctor.render(report).splitlines()
    rows = [line for line in lines if "NVIDIA H200" in line]
    assert len(rows) == 2
    assert rows[0].startswith("cuda devices") and "1: NVIDIA H200, sm_90, 141.0 GiB, driver 13.0" in rows[1]
    assert any("CUDA yes, archs 90a" in line for line in lines)


# A CLI with one extra command that is not built (no real one is today), as FAILING below does.
NOT_BUILT_SNIPPET = """
import sys
from surogate.cli.main import app, main
from surogate.cli.not_built import not_built

@app.command()
def later() -> None:
    not_built("later", "issue #99")

main(sys.argv[1:])
"""


@pytest.mark.parametrize("name", [*NOT_BUILT, "later"])
def test_not_built_command_says_so_in_one_line(name: str) -> None:
    proc = run(*NOT_BUILT[name]) if name in NOT_BUILT else run("later", code=NOT_BUILT_SNIPPET)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"surogate {name}: not built yet (") and "issue" in lines[0]


@pytest.mark.skipif(bool(_native.cuda_devices()), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_a_clear_error() -> None:
    proc = run("bench", "train", "--device", "cuda")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "built without the CUDA backend" in proc.stderr or "0 CUDA device(s)" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args", [["frobnicate"], ["sft"], ["serve", "--port", "eighty"]],
                         ids=["unknown-command", "missing-argument", "bad-option-value"])
def test_usage_errors_exit_2(args: list[str]) -> None:
    proc = run(*args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "Usage: surogate" in proc.stderr


# A CLI with one extra command that fails in the way its argument names.
FAILING = """
import sys
from surogate.cli.main import app, main
from surogate.errors import ConfigError

@app.command()
def fail(kind: str) -> None:
    if kind == "config":
        raise ConfigError("train.learning_rate: expected a number, got 'fast'", hint="write e.g. 2e-4")
    if kind == "bug":
        raise RuntimeError("an invariant broke")
    raise KeyboardInterrupt

main(sys.argv[1:])
"""


def test_surogate_error_prints_error_and_hint() -> None:
    proc = run("fail", "config", code=FAILING)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "error: train.learning_rate: expected a number, got 'fast'",
        "hint: write e.g. 2e-4",
    ]


def test_unexpected_error_is_one_line_without_debug() -> None:
    proc = run("fail", "bug", code=FAILING, SUROGATE_DEBUG="0")
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: RuntimeError: an invariant broke") and "SUROGATE_DEBUG=1" in line


def test_unexpected_error_shows_traceback_with_debug() -> None:
    proc = run("fail", "bug", code=FAILING, SUROGATE_DEBUG="1")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "an invariant broke" in proc.stderr


def test_interrupt_exits_130_quietly() -> None:
    proc = run("fail", "interrupt", code=FAILING)
    assert proc.returncode == 130
    assert proc.stderr == ""


def test_models_lists_the_families_and_a_model_folder(tmp_path) -> None:
    pytest.importorskip("torch")
    from sgtest.tiny_models import make_llama

    make_llama(tmp_path / "tiny-llama")
    proc = run("models", str(tmp_path), SUROGATE_HOME=str(tmp_path / "home"))
    assert proc.returncode == 0, proc.stderr
    assert "LlamaForCausalLM" in proc.stdout and "Qwen3ForCausalLM" in proc.stdout
    assert "tiny-llama" in proc.stdout
