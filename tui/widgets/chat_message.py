"""One turn of the chat transcript. An assistant turn grows as its stream arrives: reasoning in a
folded section (opened with enter on its title), the answer text, tool calls as name(arguments),
and a dim footer with the finish reason and token counts. A user turn lists the images it carries
(name, size, pixels) above its text, and sends them again with the history."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Collapsible, Static


class ChatMessage(Vertical):
    def __init__(self, role: str, content: str = "", images: list[tuple[str, dict]] | None = None):
        """``images``: a user turn's attached images, (label, its ``image_url`` part) each."""
        super().__init__(classes=f"message {role}")
        self.role = role
        self.content = content
        self.images = list(images or [])
        self.failed = False  # its answer failed: not sent again with the history
        self.question: ChatMessage | None = None  # an answer's user turn
        self.reasoning = ""
        self.tool_calls: dict[int, list[str]] = {}  # index -> [name, arguments]
        self.footer = ""

    def compose(self) -> ComposeResult:
        yield Static(Text(self.role, style="bold"), classes="role")
        if self.role == "assistant":
            with Collapsible(title="Reasoning", collapsed=True, classes="reasoning"):
                yield Static("", classes="reasoning-text", markup=False)
            yield Static("", classes="tool-calls", markup=False)
        if self.images:
            yield Static("\n".join(f"image: {label}" for label, _ in self.images), classes="images", markup=False)
        yield Static(self.content, classes="content", markup=False)
        yield Static("", classes="footer", markup=False)

    def on_mount(self) -> None:
        # after the first refresh: the Collapsible sets its own title while it mounts
        self.call_after_refresh(self._refresh_parts)

    def add_reasoning(self, text: str) -> None:
        self.reasoning += text
        self._refresh_parts()

    def add_content(self, text: str) -> None:
        self.content += text
        self._refresh_parts()

    def add_tool_call(self, index: int, name: str | None, arguments: str) -> None:
        call = self.tool_calls.setdefault(index, ["", ""])
        if name:
            call[0] = name
        call[1] += arguments
        self._refresh_parts()

    def finish(self, footer: str) -> None:
        self.footer = footer
        self._refresh_parts()

    def _refresh_parts(self) -> None:
        if not self.is_mounted:
            return
        self.query_one(".content", Static).update(self.content)
        self.query_one(".footer", Static).update(self.footer)
        self.query_one(".footer").display = bool(self.footer)
        if self.role != "assistant":
            return
        section = self.query_one(".reasoning", Collapsible)
        section.display = bool(self.reasoning)
        section.title = f"Reasoning ({len(self.reasoning.split())} words)"
        self.query_one(".reasoning-text", Static).update(self.reasoning)
        calls = self.query_one(".tool-calls", Static)
        calls.display = bool(self.tool_calls)
        calls.update("\n".join(f"tool call: {name}({args})" for name, args in self.tool_calls.values()))
        self.query_one(".content").display = bool(self.content) or not (self.reasoning or self.tool_calls)

    def as_message(self) -> dict:
        """This turn as an OpenAI chat message, for the next request's history."""
        msg: dict = {"role": self.role, "content": self.content}
        if self.images:  # the images first, then the text (as the vision models' examples put them)
            msg["content"] = [part for _, part in self.images] + \
                ([{"type": "text", "text": self.content}] if self.content else [])
        if self.tool_calls:
            msg["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                                 for i, (n, a) in self.tool_calls.items()]
        return msg
