"""The `surogate tui` application: four screens as modes (Library, Train, Serve, Chat), keys to
switch between them, the help screen, and the command palette's entries.

The app owns what the screens share: the settings, and the gateway URL the Serve screen
announces (the Chat screen picks it up). Screens talk to the app with messages; the app hands
values down by calling the target screen's methods.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from surogate.errors import ConfigError
from surogate.tui.notify import notify_error
from surogate.tui.screens.chat import ChatScreen
from surogate.tui.screens.help import HelpScreen
from surogate.tui.screens.library import LibraryScreen
from surogate.tui.screens.serve import ServeScreen
from surogate.tui.screens.train import TrainScreen
from surogate.tui.settings import Settings

MODES = ("library", "train", "serve", "chat")


class SurogateApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "surogate"
    MODES = {"library": LibraryScreen, "train": TrainScreen, "serve": ServeScreen, "chat": ChatScreen}
    BINDINGS = [
        *[Binding(str(i), f"go('{mode}')", mode.title(), show=False) for i, mode in enumerate(MODES, 1)],
        *[Binding(f"f{i}", f"go('{mode}')", mode.title(), show=False, priority=True)
          for i, mode in enumerate(MODES, 2)],
        Binding("f1", "help", "Help", priority=True),
        Binding("question_mark", "help", "Help", show=False),
    ]

    def __init__(self, start: str = "library", settings: Settings | None = None, include_default_model: bool = True):
        super().__init__()
        self.start = start if start in MODES else "library"
        self.settings_error: ConfigError | None = None
        if settings is None:
            try:
                settings = Settings.load()
            except ConfigError as e:  # a broken settings file: defaults, and say so once mounted
                self.settings_error, settings = e, Settings()
        self.settings = settings
        self.include_default_model = include_default_model
        self.gateway_url: str | None = None

    def on_mount(self) -> None:
        self.switch_mode(self.start)
        if self.settings_error is not None:
            notify_error(self, self.settings_error, "Settings")

    # -- navigation --

    async def action_go(self, mode: str) -> None:
        if self.current_mode != mode:
            await self.switch_mode(mode)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    async def _in_mode(self, mode: str, action: str) -> None:
        await self.action_go(mode)
        await self.screen.run_action(action)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        for mode in MODES:
            yield SystemCommand(f"Go to {mode.title()}", f"Open the {mode.title()} screen",
                                partial(self.run_action, f"go('{mode}')"))
        for title, help_text, mode, action in (
            ("Library: rescan", "Look for models again (HF cache, folders, default model)", "library", "refresh"),
            ("Library: download a model", "Fetch a model from the Hugging Face Hub by id", "library", "download"),
            ("Library: add a model folder", "Scan another folder for models (saved in settings)", "library",
             "add_folder"),
            ("Library: inspect model", "Config, tensors and chat template of the selected model", "library",
             "inspect"),
            ("Library: serve model", "Start the gateway with the selected model (on Serve)", "library", "serve"),
            ("Library: merge adapter", "Merge a LoRA adapter into the selected model", "library", "merge"),
            ("Library: quantize model", "Write the selected model as GGUF (surogate quantize)", "library",
             "quantize"),
            ("Library: delete model", "Delete the selected model from disk (asks first)", "library", "delete"),
            ("Train: new config", "Fill in the config form", "train", "tab('tab-config')"),
            ("Train: save config", "Save the form as YAML", "train", "save"),
            ("Train: launch", "Launch the config (surogate sft|pt)", "train", "launch"),
            ("Train: monitor", "The attached run's charts", "train", "tab('tab-monitor')"),
            ("Train: runs", "Past and running runs", "train", "tab('tab-runs')"),
            ("Train: pause or resume run", "SIGSTOP / SIGCONT the attached run", "train", "pause"),
            ("Train: stop run", "SIGTERM, then kill, the attached run", "train", "stop"),
            ("Serve: start gateway", "surogate serve MODEL --port N", "serve", "start"),
            ("Serve: stop gateway", "Stop the gateway this TUI started", "serve", "stop"),
            ("Chat: new conversation", "Clear the transcript", "chat", "new_chat"),
            ("Chat: refresh models", "Ask the gateway which models it serves", "chat", "refresh_models"),
            ("Chat: attach image", "Attach a local image file to the next message", "chat", "attach_image"),
        ):
            yield SystemCommand(title, help_text, partial(self._in_mode, mode, action))
        yield SystemCommand("Help", "Every key of every screen", self.action_help)
        yield SystemCommand("Settings file", "Where the settings live", self._show_settings_path)
        yield from super().get_system_commands(screen)

    def _show_settings_path(self) -> None:
        self.notify(f"{self.settings.path}\nkeys: model_folders, run_folders, config_folders, hf_cache, serve_port",
                    title="Settings", markup=False, timeout=10)

    # -- messages from the screens --

    async def on_library_screen_serve_model(self, message: LibraryScreen.ServeModel) -> None:
        await self.action_go("serve")
        self.screen.serve(message.target)

    async def on_library_screen_train_model(self, message: LibraryScreen.TrainModel) -> None:
        await self.action_go("train")
        self.screen.use_model(message.target)

    def on_serve_screen_ready(self, message: ServeScreen.Ready) -> None:
        self.gateway_url = message.url
        if isinstance(self.screen, ChatScreen):  # shown already: list the models now (else when shown)
            self.screen.set_url(message.url)
