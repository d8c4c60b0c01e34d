"""The numbers beside the loss chart: state, step and progress with ETA, loss, eval loss, learning
rate, grad norm, throughput, epoch; for a DPO run the reward margin, accuracy and the chosen /
rejected rewards, for a distill run the KL to the teacher, for a GRPO run the mean reward (and
per reward function), KL, clip fraction, completion length and rollout throughput, for a
mixture-of-experts run the expert load (max / mean rows per expert, and its worst layer's) and the
router z-loss. Everything comes from the feed (its own clock), so a finished run reads the same
every time it is opened."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from surogate.tui.feed import RunMetrics, hms

STATE_STYLES = {"running": "green", "paused": "yellow", "finished": "cyan", "stopped": "magenta",
                "failed": "red", "exited": "dim", "incomplete": "yellow", "starting": "yellow", "—": "dim"}


def _g(value, fmt: str) -> str:
    return f"{value:{fmt}}" if isinstance(value, (int, float)) else "—"


class RunStats(Widget):
    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self.metrics: RunMetrics | None = None
        self.state = "—"

    def show(self, m: RunMetrics | None, state: str = "—") -> None:
        self.metrics, self.state = m, state
        self.refresh()

    def render(self) -> Text:
        m, state = self.metrics, self.state
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append("state  ")
        text.append(state, style=f"bold {STATE_STYLES.get(state, '')}")
        if m is None:
            text.append("\n\nno run attached", style="dim")
            return text
        total = m.total_steps or 0
        text.append(f"\nstep   {m.step}/{total or '?'}\n")
        width = max(self.content_size.width - 5, 4)
        filled = round(m.progress * width)
        text.append("█" * filled, style="cyan")
        text.append("░" * (width - filled), style="dim")
        text.append(f"{m.progress * 100:>4.0f}%\n")
        eta = m.eta
        text.append(f"eta    {hms(eta) if eta is not None else '—'}\n")
        text.append(f"elapsed {hms(m.elapsed) if m.elapsed else '—'}\n")
        text.append("loss   ")
        text.append(_g(m.loss, ".4f"), style="bold cyan")
        text.append("\neval   ")
        text.append(_g(m.eval_loss, ".4f"), style="bold magenta")
        text.append(f"\nlr     {_g(m.lr, '.2e')}\n")
        text.append(f"gnorm  {_g(m.grad_norm, '.3f')}\n")
        text.append(f"tok/s  {_g(m.tokens_per_second, ',.0f')}\n")
        text.append(f"epoch  {_g(m.epoch, '.2f')}")
        if m.rewards:  # a preference run: TRL's reward metrics of the last step
            r = m.rewards
            text.append(f"\nmargin {_g(r.get('margins'), '.4f')}\n")
            acc = r.get("accuracies")
            text.append(f"acc    {_g(acc * 100 if acc is not None else None, '.0f')}%\n")
            text.append(f"chosen {_g(r.get('chosen'), '.4f')}\n")
            text.append(f"reject {_g(r.get('rejected'), '.4f')}")
        if m.reward_points:  # a GRPO run
            text.append("\nreward ")
            text.append(_g(m.reward, ".4f"), style="bold green")
            for name, value in m.reward_fns.items():
                text.append(f"\n {name[:12]:<12} {_g(value, '.3f')}")
            clip = m.clip_ratio
            text.append(f"\nclip   {_g(clip * 100 if clip is not None else None, '.1f')}%")
            text.append(f"\nlen    {_g(m.completion_length, '.1f')}")
            text.append(f"\nroll/s {_g(m.rollout_tokens_per_second, ',.0f')}")
        if m.kl is not None:  # a distillation run; GRPO's KL to the reference
            text.append(f"\nkl     {_g(m.kl, '.4f')}")
        if m.expert_load:  # a mixture-of-experts run: the last step's expert load, max / mean
            text.append("\nexpert ")
            text.append(f"{m.expert_load[-1][1]:.2f}x", style="bold yellow")
            if m.expert_load_worst:
                text.append("\nworst  ")
                text.append(f"{m.expert_load_worst[-1][1]:.2f}x", style="bold red")
            if "z_loss" in m.moe_losses:
                text.append(f"\nz loss {_g(m.moe_losses['z_loss'], '.4f')}")
        return text
