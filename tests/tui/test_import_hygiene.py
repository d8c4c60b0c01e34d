"""The core and the CLI import without the UI: `import surogate`, `import surogate.cli.main` and
`surogate tui --help` load no textual; the TUI's plain-data modules (catalog, feed, settings,
processes, runs, attachments) load none either, so they work on a headless box."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def top_level_modules(code: str) -> set[str]:
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.splitlines()[-1]))


@pytest.mark.parametrize("code", [
    "import surogate",
    "import surogate.cli.main",
    "from surogate.cli.main import main\ntry:\n    main(['tui', '--help'])\nexcept SystemExit:\n    pass",
    "from surogate.cli.tui import dev_layout\ndev_layout()\n"
    "import surogate.tui.catalog, surogate.tui.feed, surogate.tui.settings, surogate.tui.processes, surogate.tui.runs\n"
    "import surogate.tui.attachments",
], ids=["surogate", "cli", "tui-help", "tui-data-modules"])
def test_textual_stays_unloaded(code):
    loaded = top_level_modules(code)
    assert "textual" not in loaded
    assert "granian" not in loaded and "torch" not in loaded


def test_the_app_loads_textual_and_not_the_gateway():
    loaded = top_level_modules("from surogate.cli.tui import dev_layout\ndev_layout()\nimport surogate.tui.app")
    assert "textual" in loaded
    assert "granian" not in loaded  # the gateway runs in its own process
