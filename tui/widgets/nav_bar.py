"""The top line of every main screen: the four screens with their keys, the current one lit."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

SCREENS = (("library", "1", "Library"), ("train", "2", "Train"), ("serve", "3", "Serve"), ("chat", "4", "Chat"))


class NavBar(Widget):
    def __init__(self, active: str, *, status: str = ""):
        super().__init__()
        self.active = active
        self.status = status

    def set_status(self, status: str) -> None:
        self.status = status
        self.refresh()

    def render(self) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(" surogate ", style="bold reverse")
        for mode, key, label in SCREENS:
            text.append(" ")
            if mode == self.active:
                text.append(f" {key} {label} ", style="bold black on cyan")
            else:
                text.append(f" {key}", style="bold cyan")
                text.append(f" {label} ")
        right = Text(f"{self.status}  F1 help ", style="dim")
        gap = self.content_size.width - text.cell_len - right.cell_len
        if gap > 0:
            text.append(" " * gap)
            text.append_text(right)
        return text
