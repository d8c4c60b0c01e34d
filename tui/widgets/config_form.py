"""A form for the common keys of a run config. It only collects text: the Train screen validates
the mapping with load_config (in a worker) and hands the error back, and the form marks the
field the error's key path names. Values are read the way YAML would read them (2e-4 a
number, 16 an integer), so a wrong value gets load_config's own message."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.widgets import Input, Label, Select

# (key, label, default, choices or None)
FIELDS: tuple[tuple[str, str, str, tuple[str, ...] | None], ...] = (
    ("kind", "Kind", "sft", ("sft", "pt", "dpo")),
    ("model", "Model", "", None),
    ("dataset_path", "Dataset", "", None),
    ("dataset_type", "Dataset type", "auto", ("auto", "messages", "instruction", "text", "preference")),
    ("output_dir", "Output dir", "output/run", None),
    ("recipe", "Recipe", "bf16", ("bf16", "fp8_hybrid", "fp32")),
    ("lora_rank", "LoRA rank", "16", None),
    ("lora_alpha", "LoRA alpha", "32", None),
    ("learning_rate", "Learning rate", "2e-4", None),
    ("max_steps", "Max steps", "100", None),
    ("sequence_len", "Sequence len", "1024", None),
    ("per_device_train_batch_size", "Batch size", "2", None),
    ("gradient_accumulation_steps", "Grad accum", "4", None),
    ("save_as", "Save as", "configs/run.yaml", None),
)
PLACEHOLDERS = {"model": "HF folder, cached hub id (org/name)", "dataset_path": "JSONL file, folder or hub dataset id",
                "save_as": "where the YAML is written"}
NUMERIC = {"lora_rank", "lora_alpha", "learning_rate", "max_steps", "sequence_len", "per_device_train_batch_size",
           "gradient_accumulation_steps"}


def _yaml_scalar(text: str):
    text = text.strip()
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


class ConfigForm(VerticalScroll):
    class Changed(Message):
        """A field changed; ``form.values()`` has the new mapping."""

        def __init__(self, form: ConfigForm):
            super().__init__()
            self.form = form

    def compose(self) -> ComposeResult:
        for key, label, default, choices in FIELDS:
            with Horizontal(classes="form-row"):
                yield Label(label, classes="form-label")
                if choices:
                    yield Select([(c, c) for c in choices], value=default, allow_blank=False, id=f"f-{key}",
                                 compact=True)
                else:
                    yield Input(default, placeholder=PLACEHOLDERS.get(key, ""), id=f"f-{key}", compact=True)

    def raw(self, key: str) -> str:
        widget = self.query_one(f"#f-{key}")
        return str(widget.value)

    def set(self, key: str, value: str) -> None:
        widget = self.query_one(f"#f-{key}")
        widget.value = value

    @property
    def kind(self) -> str:
        return self.raw("kind")

    @property
    def save_path(self) -> str:
        return self.raw("save_as").strip()

    def values(self) -> dict:
        """The config mapping (what the YAML file will hold)."""
        data: dict = {"model": self.raw("model").strip(),
                      "datasets": [{"path": self.raw("dataset_path").strip(), "type": self.raw("dataset_type")}],
                      "output_dir": self.raw("output_dir").strip(), "recipe": self.raw("recipe")}
        for key in ("lora_rank", "lora_alpha", "learning_rate", "max_steps", "sequence_len",
                    "per_device_train_batch_size", "gradient_accumulation_steps"):
            data[key] = _yaml_scalar(self.raw(key))
        if self.kind == "dpo":  # DPO's length limit is TRL's max_length (prompt + completion)
            data["max_length"] = data.pop("sequence_len")
        return data

    def mark_error(self, key_path: str | None) -> None:
        """Highlight the field a load_config key path names (None clears)."""
        field = None
        if key_path:
            head = key_path.split(".")[0].split("[")[0]
            field = {"datasets": "dataset_path", "model": "model"}.get(head, head)
            if key_path.endswith(".type"):
                field = "dataset_type"
        for key, *_ in FIELDS:
            self.query_one(f"#f-{key}").set_class(key == field, "error")

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.Changed(self))

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        self.post_message(self.Changed(self))
