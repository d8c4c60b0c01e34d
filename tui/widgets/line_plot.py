"""A line chart in braille dots: each terminal cell is a 2x4 grid of dots, so a 60x10 cell plot
has 120x40 points of resolution. Several series share the axes; where two meet in one cell
the later one's colour wins (so eval loss, drawn last, stays visible on the train loss).

Dependency-free on purpose: a plotting library for one chart is not worth its weight.
"""

from __future__ import annotations

import math

from rich.text import Text
from textual.widget import Widget

# Dot (dx, dy) of a braille cell -> its bit in U+2800 + bits.
_BITS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
_BRAILLE = 0x2800


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e4 or magnitude < 1e-3:
        return f"{value:.1e}"
    return f"{value:.4g}" if magnitude < 10 else f"{value:.1f}"


def _fmt_x(value: float) -> str:
    return str(int(value)) if value == int(value) and abs(value) < 1e9 else _fmt(value)


class LinePlot(Widget):
    """``plot.set_series("loss", [(step, value), ...], "cyan")``; the widget sizes itself to its box."""

    def __init__(self, empty_text: str = "no points yet", *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.empty_text = empty_text
        self._series: dict[str, tuple[list[tuple[float, float]], str]] = {}

    def set_series(self, name: str, points: list[tuple[float, float]], style: str) -> None:
        clean = [(float(x), float(y)) for x, y in points if math.isfinite(x) and math.isfinite(y)]
        self._series[name] = (clean, style)
        self.refresh()

    def clear(self) -> None:
        self._series.clear()
        self.refresh()

    @property
    def point_count(self) -> int:
        return sum(len(points) for points, _ in self._series.values())

    def render(self) -> Text:
        return draw(self._series, self.content_size.width, self.content_size.height, self.empty_text)


def draw(series: dict[str, tuple[list[tuple[float, float]], str]], width: int, height: int,
         empty_text: str = "no points yet") -> Text:
    """The chart of ``series`` (name -> (points, style)) in a ``width`` x ``height`` cell box."""
    points = [p for pts, _ in series.values() for p in pts]
    if not points or width < 12 or height < 3:
        return Text(empty_text, style="dim", justify="center")
    xs, ys = [x for x, _ in points], [y for _, y in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 0.5, y1 + 0.5
    else:
        pad = (y1 - y0) * 0.05
        y0, y1 = y0 - pad, y1 + pad
    labels = [_fmt(y1), _fmt((y0 + y1) / 2), _fmt(y0)]
    lw = max(len(s) for s in labels)
    pw, ph = width - lw - 1, height - 1  # plot cells; one column for the axis, one row for x labels
    dots_w, dots_h = pw * 2, ph * 4

    def to_dot(x: float, y: float) -> tuple[int, int]:
        dx = 0 if x1 == x0 else round((x - x0) / (x1 - x0) * (dots_w - 1))
        dy = round((y1 - y) / (y1 - y0) * (dots_h - 1))
        return dx, dy

    cells: dict[tuple[int, int], int] = {}
    owner: dict[tuple[int, int], str] = {}
    for pts, style in series.values():
        dots = [to_dot(x, y) for x, y in pts]
        if len(dots) == 1:
            dots = dots * 2
        for (ax, ay), (bx, by) in zip(dots, dots[1:], strict=False):
            for px, py in _segment(ax, ay, bx, by):
                cell = (px // 2, py // 4)
                cells[cell] = cells.get(cell, 0) | _BITS[py % 4][px % 2]
                owner[cell] = style

    text = Text(no_wrap=True, overflow="crop")
    label_rows = {0: labels[0], ph // 2: labels[1], ph - 1: labels[2]}
    for row in range(ph):
        text.append(label_rows.get(row, "").rjust(lw), style="dim")
        text.append("┤" if row in label_rows else "│", style="dim")
        for col in range(pw):
            bits = cells.get((col, row))
            if bits:
                text.append(chr(_BRAILLE + bits), style=owner[(col, row)])
            else:
                text.append(" ")
        text.append("\n")
    # x axis: first and last x, the legend between them
    left, right = _fmt_x(x0), _fmt_x(x1)
    legend = Text()
    for name, (pts, style) in series.items():
        if pts:
            legend.append(" ● " if legend else "● ", style=style)
            legend.append(name, style="dim")
    gap = pw - len(left) - len(right)
    text.append(" " * lw + "└", style="dim")
    text.append(left, style="dim")
    if legend.cell_len <= gap - 2:
        pad = gap - legend.cell_len
        text.append(" " * (pad // 2))
        text.append_text(legend)
        text.append(" " * (pad - pad // 2))
    else:
        text.append(" " * max(gap, 1))
    text.append(right, style="dim")
    return text




def _segment(x0: int, y0: int, x1: int, y1: int):
    """The dots of a line from (x0, y0) to (x1, y1) (Bresenham)."""
    dx, dy = abs(x1 - x0), -abs(y1 - y0)
    sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
    err = dx + dy
    while True:
        yield x0, y0
        if x0 == x1 and y0 == y1:
            return
        e2 = 2 * err
        if e2 >= dy:
            err += dy
            x0 += sx
        if e2 <= dx:
            err += dx
            y0 += sy
