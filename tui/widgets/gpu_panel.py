"""Per-GPU utilization, memory, temperature and power, one line each, from the feed's "gpu"
lines (or a local sample when no run is attached); a plain "no GPU" line when there are none."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget


def _bar(fraction: float | None, width: int) -> Text:
    if fraction is None:
        return Text("·" * width, style="dim")
    fraction = min(max(fraction, 0.0), 1.0)
    filled = round(fraction * width)
    style = "green" if fraction < 0.7 else "yellow" if fraction < 0.9 else "red"
    return Text("█" * filled, style=style) + Text("░" * (width - filled), style="dim")


def _num(value, fmt: str, unit: str) -> str:
    return f"{value:{fmt}}{unit}" if isinstance(value, (int, float)) else "n/a"


class GPUPanel(Widget):
    NO_GPU = "No GPU: no samples (a CPU run, or no NVIDIA driver on this machine)"

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self.gpus: list[dict] | None = None
        self.source = ""

    def show_gpus(self, gpus: list[dict] | None, source: str = "") -> None:
        self.gpus, self.source = gpus, source
        self.refresh(layout=True)

    def get_content_height(self, container, viewport, width: int) -> int:
        return max(len(self.gpus or []), 1) + (1 if self.source else 0)

    def render(self) -> Text:
        gpus, source = self.gpus, self.source
        if not gpus:
            return Text(self.NO_GPU, style="dim", no_wrap=True, overflow="ellipsis")
        text = Text(no_wrap=True, overflow="ellipsis")
        wide = self.content_size.width >= 100
        for i, g in enumerate(gpus):
            if i:
                text.append("\n")
            name = str(g.get("name") or "GPU").replace("NVIDIA ", "")
            text.append(f"{g.get('index', i)} {name[:14]:<14} ", style="bold")
            util = g.get("utilization")
            text.append("util ")
            text.append_text(_bar(util / 100 if isinstance(util, (int, float)) else None, 10 if wide else 6))
            text.append(f" {_num(util, '.0f', '%'):>4}  ")
            used, total = g.get("memory_used_mib"), g.get("memory_total_mib")
            known = isinstance(used, (int, float)) and isinstance(total, (int, float)) and total
            frac = used / total if known else None
            text.append("mem ")
            text.append_text(_bar(frac, 10 if wide else 6))
            if isinstance(used, (int, float)) and isinstance(total, (int, float)):
                text.append(f" {used / 1024:.1f}/{total / 1024:.0f}G ")
            else:
                text.append(" n/a ")
            text.append(f" {_num(g.get('temperature_c'), '.0f', '°C')}  {_num(g.get('power_w'), '.0f', 'W')}")
        if source:
            text.append(f"\n{source}", style="dim")
        return text
