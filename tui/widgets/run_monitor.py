"""The attached run at a glance: a title line, the loss / eval-loss chart (and a GRPO run's
reward), the numbers beside it, for a mixture-of-experts run the expert-load chart (max / mean rows
per expert, overall and its worst layer; 1 is balanced), and the GPU panel. It shows what it is
given (attributes down); the Train screen feeds it."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from surogate.tui.feed import RunMetrics
from surogate.tui.paths import short_path
from surogate.tui.widgets.gpu_panel import GPUPanel
from surogate.tui.widgets.line_plot import LinePlot
from surogate.tui.widgets.run_stats import RunStats


class RunMonitor(Vertical):
    def compose(self) -> ComposeResult:
        yield Static("no run attached: launch one (Config tab) or pick one (Runs tab)", id="run-title",
                     markup=False)
        with Horizontal(id="run-main"):
            yield LinePlot("waiting for the first step…", id="loss-plot")
            yield RunStats(id="run-stats")
        moe = LinePlot("", id="moe-plot")  # shown only for a MoE run
        moe.border_title = "expert load: max / mean rows per expert (1 = balanced)"
        yield moe
        yield GPUPanel(id="gpu-panel")

    def show(self, title: str, m: RunMetrics | None, state: str) -> None:
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(title, style="bold")
        if m is not None and m.output:
            text.append(f"  → {short_path(m.output)}", style="dim")
        self.query_one("#run-title", Static).update(text)
        plot = self.query_one("#loss-plot", LinePlot)
        moe = self.query_one("#moe-plot", LinePlot)
        if m is None:
            plot.clear()
            moe.clear()
        else:
            plot.set_series("loss", m.losses, "cyan")
            plot.set_series("eval loss", m.eval_losses, "magenta")
            if m.reward_points:
                plot.set_series("reward", m.reward_points, "green")
            if m.kl_points:  # distill: the KL to the teacher; GRPO: to the reference
                plot.set_series("kl", m.kl_points, "yellow")
            moe.set_series("worst layer", m.expert_load_worst, "red")
            moe.set_series("expert load", m.expert_load, "yellow")
        moe.display = m is not None and bool(m.expert_load)
        self.query_one(RunStats).show(m, state)
        self.set_class(state in ("running", "paused"), "live")

    def show_gpus(self, gpus: list[dict] | None, source: str = "") -> None:
        self.query_one(GPUPanel).show_gpus(gpus, source)
