"""GPU samples for the metrics feed (and the TUI's GPU panel): utilization, memory, temperature
and power per GPU, read through `nvidia-smi` (NVML underneath) so that no extra Python package
is needed. Machines without an NVIDIA driver simply have no samples."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable

FIELDS = ("index", "name", "utilization.gpu", "memory.used", "memory.total", "temperature.gpu", "power.draw")
KEYS = ("index", "name", "utilization", "memory_used_mib", "memory_total_mib", "temperature_c", "power_w")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def sample_gpus(timeout: float = 5.0) -> list[dict] | None:
    """One sample per GPU, or None when there is no nvidia-smi (no NVIDIA driver)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    gpus = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(FIELDS):
            continue
        row = {k: (_number(v) if k != "name" else v) for k, v in zip(KEYS, parts)}
        row["index"] = int(row["index"]) if row["index"] is not None else len(gpus)
        gpus.append(row)
    return gpus


class GPUSampler:
    """Calls `emit(samples)` every `interval` seconds from a daemon thread until stopped."""

    def __init__(self, emit: Callable[[list[dict]], None], interval: float = 10.0):
        self.emit, self.interval = emit, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        if sample_gpus() is None:
            return False
        self._thread = threading.Thread(target=self._run, name="surogate-gpu-sampler", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            samples = sample_gpus()
            if samples:
                self.emit(samples)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5)
            self._thread = None
