"""Download a model from the Hugging Face Hub into the HF cache, with progress and cancel.

huggingface_hub reports progress through a tqdm class; ours forwards it to the dialog and raises
at the next update once cancel is pressed (a download thread cannot be killed from outside).
Offline or with a wrong id the hub raises, and the dialog says so with a hint.
"""

from __future__ import annotations

import threading

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Input, ProgressBar, Static

from surogate.tui.notify import WorkerErrors, describe


class DownloadCancelled(Exception):
    pass


def _progress_class(screen: DownloadScreen, cancel: threading.Event):
    from tqdm.auto import tqdm

    class Progress(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = False
            kwargs["file"] = open("/dev/null", "w")  # noqa: SIM115 -- tqdm owns it; the terminal is Textual's
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            if cancel.is_set():
                raise DownloadCancelled()
            result = super().update(n)
            screen.post_message(DownloadScreen.Progress(self.n, self.total, self.desc or ""))
            return result

    return Progress


class DownloadScreen(WorkerErrors, ModalScreen[bool]):
    BINDINGS = [Binding("escape", "close", "Close / cancel")]

    class Progress(Message):
        def __init__(self, done: float, total: float | None, desc: str):
            super().__init__()
            self.done, self.total, self.desc = done, total, desc

    class Finished(Message):
        def __init__(self, ok: bool, text: str):
            super().__init__()
            self.ok, self.text = ok, text

    def __init__(self, cache_dir: str | None = None):
        super().__init__()
        self.cache_dir = cache_dir
        self.cancel = threading.Event()
        self.running = False
        self.downloaded = False

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static("Download from the Hugging Face Hub", classes="dialog-title")
            yield Input(placeholder="org/name, e.g. HuggingFaceTB/SmolLM2-135M-Instruct", id="hub-id")
            yield ProgressBar(id="download-progress", show_eta=False)
            yield Static("safetensors, tokenizer and config files go to the HF cache", id="download-status",
                         classes="dialog-detail", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Download", variant="primary", id="start")
                yield Button("Close", id="close")

    def on_input_submitted(self) -> None:
        self.start()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            self.start()
        else:
            self.action_close()

    def start(self) -> None:
        repo = self.query_one("#hub-id", Input).value.strip()
        if self.running or not repo:
            return
        self.running = True
        self.cancel.clear()
        self.query_one("#close", Button).label = "Cancel"
        self.query_one("#start", Button).disabled = True
        self.query_one("#download-status", Static).update(f"fetching {repo} …")
        self.fetch(repo)

    @work(thread=True, exit_on_error=False, group="download")
    def fetch(self, repo: str) -> None:
        from huggingface_hub import snapshot_download

        from surogate.io.hf_folder import _OTHER_WEIGHTS  # the same skip list as resolve_model_path

        try:
            path = snapshot_download(repo, cache_dir=self.cache_dir, ignore_patterns=list(_OTHER_WEIGHTS),
                                     tqdm_class=_progress_class(self, self.cancel))
        except DownloadCancelled:
            self.post_message(self.Finished(False, "cancelled"))
            return
        except Exception as e:
            message, _ = describe(e)
            self.post_message(self.Finished(False, f"{message.splitlines()[0][:300]}\nhint: check the id and the "
                                                   "network; gated models need `hf auth login` first"))
            return
        self.post_message(self.Finished(True, f"done: {path}"))

    def on_download_screen_progress(self, message: Progress) -> None:
        bar = self.query_one("#download-progress", ProgressBar)
        bar.update(total=message.total, progress=message.done)
        self.query_one("#download-status", Static).update(message.desc or "downloading …")

    def on_download_screen_finished(self, message: Finished) -> None:
        self.running = False
        self.downloaded |= message.ok
        self.query_one("#close", Button).label = "Close"
        self.query_one("#start", Button).disabled = False
        self.query_one("#download-status", Static).update(message.text)
        if not message.ok and message.text != "cancelled":
            self.notify(message.text, title="Download failed", severity="error", markup=False, timeout=12)

    def action_close(self) -> None:
        if self.running and not self.cancel.is_set():
            self.cancel.set()
            self.query_one("#download-status", Static).update("cancelling at the next progress update …"
                                                               " (esc again leaves it to finish unseen)")
            return
        self.dismiss(self.downloaded)
