"""`surogate doctor`: what is installed, what the native engine was built with, what this machine has.

The report is collected as one dict (what `--json` prints) and rendered as aligned text from it.
It never fails on a broken install: a native module that does not import is part of the report,
and the command then exits 1. Optional extras are found without importing them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from typing import Annotated, Any

import typer

import surogate

EXTRAS = ("textual", "granian", "wandb", "torch")
# The CPU features that set the CPU backend's speed (vector width, bf16 dot products, AMX tiles);
# --json lists all of them.
KEY_CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")
NATIVE_HINT = (
    "reinstall surogate (pip install --force-reinstall surogate, or pip install . in a "
    "checkout); for PYTHONPATH development builds, run .ci/build-dev"
)


def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Check the install, native build, CPU and CUDA devices."""
    report = collect()
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        typer.echo(render(report))
    if report["native"]["error"]:
        raise typer.Exit(1)


def collect() -> dict[str, Any]:
    report: dict[str, Any] = {
        "surogate": {"version": surogate.__version__, "location": os.path.dirname(surogate.__file__)},
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": platform.platform(),
        "native": {"error": None, "hint": None, "build": None},
        "cpu": None,
        "threads": None,
        "cuda_devices": None,
        "extras": {name: extra_version(name) for name in EXTRAS},
    }
    try:
        from surogate import _native
    except ImportError as e:
        report["native"].update(error=f"{type(e).__name__}: {e}", hint=NATIVE_HINT)
        return report
    report["native"]["build"] = dict(_native.build_info())
    features = dict(_native.cpu_features())
    report["cpu"] = {
        "brand": features.pop("brand"),
        "logical_cpus": features.pop("logical_cpus"),
        "features": features,
    }
    report["threads"] = _native.num_threads()
    report["cuda_devices"] = [dict(d) for d in _native.cuda_devices()]
    return report


def extra_version(name: str) -> str | None:
    """The installed version of an optional package, or None; the package is not imported."""
    if importlib.util.find_spec(name) is None:
        return None
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


def render(report: dict[str, Any]) -> str:
    rows: list[tuple[str, str]] = [
        ("surogate", f"{report['surogate']['version']} ({report['surogate']['location']})"),
        ("python", f"{report['python']['version']} ({report['python']['executable']})"),
        ("platform", report["platform"]),
    ]
    native = report["native"]
    if native["error"]:
        rows += [("native", f"import failed: {native['error']}"), ("  hint", native["hint"])]
        rows += [("cpu, cuda", "unknown (the native module did not import)")]
    else:
        rows += native_rows(native["build"], report["cpu"], report["threads"], report["cuda_devices"])
    installed = [f"{name} {version}" for name, version in report["extras"].items() if version]
    absent = [name for name, version in report["extras"].items() if not version]
    rows.append(("extras", present_and_missing(installed, absent, "not installed")))
    width = max(len(key) for key, _ in rows) + 2
    return "\n".join(f"{key:<{width}}{value}" for key, value in rows)


def present_and_missing(present: list[str], missing: list[str], missing_word: str) -> str:
    text = " ".join(present)
    if missing:
        text += ("; " if text else "") + f"{missing_word}: {' '.join(missing)}"
    return text


def native_rows(build: dict, cpu: dict, threads: int, devices: list[dict]) -> list[tuple[str, str]]:
    cuda = f"yes, archs {build.get('cuda_archs', '?')}, runtime {build.get('cuda_runtime_version', '?')}"
    rows = [
        ("native", f"{build['compiler']}, BLAS {build['blas']}, CUDA {cuda if build['cuda'] else 'no'}"),
        ("  flags", build.get("cxx_flags", "").strip() or "-"),
        ("cpu", f"{cpu['brand'] or 'unknown'}, {cpu['logical_cpus']} logical CPUs"),
    ]
    have = [f for f in KEY_CPU_FEATURES if cpu["features"].get(f)]
    lack = [f for f in KEY_CPU_FEATURES if f not in have]
    rows.append(("cpu features", present_and_missing(have, lack, "missing")))
    rows.append(("threads", str(threads)))
    if not devices:
        rows.append(("cuda devices", "none" if build["cuda"] else "none (built without CUDA)"))
    for i, d in enumerate(devices):
        major, minor = d["compute_capability"]
        gib = d["total_memory"] / 2**30
        rows.append(
            ("cuda devices" if i == 0 else "",
             f"{d['index']}: {d['name']}, sm_{major}{minor}, {gib:.1f} GiB, driver {d['driver_version']}")
        )
    return rows
