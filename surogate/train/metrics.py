"""Where training reports go: a JSONL feed (the TUI tails it), wandb when asked, and the
terminal (a progress line with ETA and tokens/s on a TTY, plain lines otherwise).

JSONL lines: ``{"type": "step", "step", "loss", "lr", "grad_norm", "tokens_per_second",
"epoch", "elapsed", ...}`` (a mixture-of-experts run adds ``moe_tokens_per_expert`` (rows routed
to each expert over the step, all MoE layers together), ``moe_load_max`` / ``moe_load_mean`` of
those, ``moe_load_imbalance`` (max / mean, 1 = balanced), ``moe_layer_imbalance`` (per layer) and
the unscaled ``moe_aux_loss`` / ``moe_z_loss``), ``{"type": "eval", "step", "eval_loss", ...}``, and
``{"type": "gpu", "gpus": [{"index", "name", "utilization", "memory_used_mib", ...}]}`` every
`gpu_interval` seconds when an NVIDIA GPU is present, and ``{"type": "start" | "end", ...}``
framing a run. Each line is flushed as it is written (under a lock: the GPU sampler writes from
its own thread).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any


class MetricsFeed:
    def __init__(self, path: str | Path | None, *, wandb_project: str | None = None, wandb_name: str | None = None,
                 use_wandb: bool = False, config: dict | None = None, resume_id_file: Path | None = None,
                 stream: IO[str] | None = None, total_steps: int = 0, gpu_interval: float = 10.0):
        self.path = Path(path) if path else None
        self._f = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", buffering=1)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.total_steps = total_steps
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._gpu = None
        if self._f is not None and gpu_interval > 0:
            from surogate.train.gpu_monitor import GPUSampler

            self._gpu = GPUSampler(lambda gpus: self.write({"type": "gpu", "gpus": gpus}), gpu_interval)
            if not self._gpu.start():
                self._gpu = None
        self._wandb = None
        if use_wandb:
            import wandb  # only now: it takes most of a second to import

            run_id = None
            if resume_id_file is not None and resume_id_file.is_file():
                run_id = resume_id_file.read_text().strip()
            self._wandb = wandb.init(project=wandb_project, name=wandb_name, config=config, id=run_id,
                                     resume="allow" if run_id else None)
            if resume_id_file is not None:
                resume_id_file.parent.mkdir(parents=True, exist_ok=True)
                resume_id_file.write_text(self._wandb.id)

    def write(self, record: dict[str, Any]) -> None:
        record = {"time": round(time.time(), 3), **record}
        with self._lock:
            if self._f is not None:
                self._f.write(json.dumps(record) + "\n")
        if self._wandb is not None and record.get("type") in ("step", "eval"):
            data = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k not in ("step", "time")}
            self._wandb.log(data, step=record["step"])

    def step(self, step: int, **values: Any) -> None:
        self.write({"type": "step", "step": step, **values})
        elapsed = time.monotonic() - self.t0
        done = step - values.get("start_step", 0)
        rest = self.total_steps - step
        eta = elapsed / done * rest if done > 0 else 0.0
        text = (f"step {step}/{self.total_steps}  loss {values.get('loss', float('nan')):.4f}  "
                f"lr {values.get('lr', 0):.2e}  grad_norm {values.get('grad_norm', 0):.3f}  "
                f"{values.get('tokens_per_second', 0):,.0f} tok/s  eta {_hms(eta)}")
        if self.tty:
            width = 24
            filled = int(width * step / max(self.total_steps, 1))
            self.stream.write("\r[" + "#" * filled + "-" * (width - filled) + "] " + text + "\x1b[K")
            self.stream.flush()
        else:
            self.stream.write(text + "\n")

    def eval(self, step: int, **values: Any) -> None:
        self.write({"type": "eval", "step": step, **values})
        self.message(f"eval at step {step}: loss {values.get('eval_loss', float('nan')):.4f}")

    def message(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._gpu is not None:
            self._gpu.stop()
            self._gpu = None
        if self.tty:
            self.stream.write("\n")
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _hms(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def wandb_offline_in_tests() -> None:
    os.environ.setdefault("WANDB_MODE", "offline")
