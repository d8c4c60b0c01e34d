"""`import surogate` and the CLI's import load neither the UI, the server, wandb nor torch.

Each check runs in a fresh interpreter (`-P`: the installed or PYTHONPATH surogate, never the
current directory) and lists the top-level modules it ended with.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("textual", "granian", "wandb", "torch", "transformers")


def loaded_after(code: str) -> tuple[set[str], float]:
    script = (
        "import json, sys, time\n"
        "t0 = time.perf_counter()\n"
        f"{code}\n"
        "dt = time.perf_counter() - t0\n"
        "print(json.dumps([sorted({m.split('.')[0] for m in sys.modules}), dt]))\n"
    )
    proc = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    modules, seconds = json.loads(proc.stdout.splitlines()[-1])
    return set(modules), seconds


@pytest.mark.parametrize(
    "code",
    [
        "import surogate",
        "import surogate.cli.main",
        # doctor looks the extras up with find_spec: it must not import them either.
        "from surogate.cli.main import main\ntry:\n    main(['doctor', '--json'])\nexcept SystemExit:\n    pass",
    ],
    ids=["surogate", "cli", "doctor"],
)
def test_heavy_modules_stay_unloaded(code: str) -> None:
    modules, seconds = loaded_after(code)
    loaded = sorted(modules & set(HEAVY))
    assert not loaded, f"{code!r} loaded {loaded} (in {seconds:.2f} s)"
    print(f"{code.splitlines()[0]!r}: {seconds * 1000:.0f} ms, {len(modules)} top-level modules")
