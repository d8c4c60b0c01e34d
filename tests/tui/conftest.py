"""The TUI under test: its shipped name in the source layout, a fixed world for the screens, and
helpers to drive the app with Textual's Pilot.

The wheel maps the top-level ``tui/`` folder to ``surogate/tui`` (pyproject's ``wheel.packages``);
in a source checkout run with ``PYTHONPATH=$PWD`` that mapping does not exist, so it is
registered under that name here (``surogate.cli.tui.dev_layout``, which `surogate tui` itself
uses, does the same for ``gateway/``). An installed surogate is used as is.

Snapshots go to ``snapshots/tui/<test file>/`` at the repository root. The world is fixed: the
current directory and $HOME are a temporary folder (paths show as relative or ``~/``), the clock
shows UTC, nvidia-smi reports nothing, the HF cache is empty and the models are written byte for
byte by ``write_fake_model`` (no transformers version in their sizes).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from surogate.cli.tui import dev_layout

dev_layout()

from surogate.tui.app import SurogateApp  # noqa: E402
from surogate.tui.settings import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT / "snapshots" / "tui"


def pytest_configure(config):
    # pytest-textual-snapshot writes its HTML report to the current directory by default
    if getattr(config.option, "snapshot_report", None) == "snapshot_report.html":
        config.option.snapshot_report = str(ROOT / "build" / "snapshot_report.html")


@pytest.fixture(autouse=True)
def _snapshots_at_repo_root(monkeypatch):
    """pytest-textual-snapshot keeps SVGs beside the test file; ours live under snapshots/."""
    try:
        import pytest_textual_snapshot as pts
    except ImportError:
        return

    class RootSnapshots(pts.SVGImageExtension):
        @classmethod
        def dirname(cls, *, test_location) -> str:
            return str(SNAPSHOTS / test_location.basename)

    monkeypatch.setattr(pts, "SVGImageExtension", RootSnapshots)


@pytest.fixture
def world(tmp_path, monkeypatch) -> Path:
    """A working directory the app starts in, with $HOME, $SUROGATE_HOME and the clock pinned."""
    work = tmp_path / "work"
    (work / "models").mkdir(parents=True)
    (work / "output").mkdir()
    (work / "configs").mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.setenv("SUROGATE_HOME", str(tmp_path / "user" / ".config" / "surogate"))
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    from surogate.train import gpu_monitor
    from surogate.tui.screens import serve, train

    monkeypatch.setattr(gpu_monitor, "sample_gpus", lambda timeout=5.0: None)
    monkeypatch.setattr(serve, "POLL_SECONDS", 0.2)  # the screens' polling, quicker for tests
    monkeypatch.setattr(train, "POLL_SECONDS", 0.2)
    yield work
    monkeypatch.delenv("TZ")
    time.tzset()


@pytest.fixture
def settings(world, tmp_path) -> Settings:
    (tmp_path / "hf-cache").mkdir()
    return Settings(model_folders=["models", "output"], run_folders=["output"], config_folders=["configs"],
                    hf_cache=str(tmp_path / "hf-cache"), serve_port=free_port(),
                    path=Path(os.environ["SUROGATE_HOME"]) / "settings.toml")


@pytest.fixture
def make_app(settings) -> Callable[..., SurogateApp]:
    def make(start: str = "library", include_default_model: bool = False) -> SurogateApp:
        return SurogateApp(start=start, settings=settings, include_default_model=include_default_model)

    return make


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drive(app: SurogateApp, script: Callable[..., Awaitable[None]], size: tuple[int, int] = (80, 24)) -> None:
    """Run ``script(pilot)`` against the app, headless, at a fixed terminal size."""

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await script(pilot)

    asyncio.run(main())


async def wait_for(pilot, predicate: Callable[[], bool], timeout: float = 120.0,
                   what: str | Callable[[], str] = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            notes = [n.message for n in pilot.app._notifications]
            what = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}; notifications: {notes}")
        await pilot.pause(0.1)


def notifications(app: SurogateApp) -> list[str]:
    return [n.message for n in app._notifications]


async def settle(pilot) -> None:
    """Let workers finish and the screen redraw; stop the cursor blinking (snapshots)."""
    from textual.widgets import Input

    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    for box in pilot.app.screen.query(Input):
        box.cursor_blink = False
    await pilot.pause()


# -- a fixed world --

def write_fake_model(folder: Path, layers: int = 2, hidden: int = 64, vocab: int = 512) -> Path:
    """A Llama-shaped HF folder with zero weights: config, safetensors and a chat template, the
    same bytes on every machine."""
    from surogate.io import save_safetensors

    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": 2 * hidden, "num_hidden_layers": layers, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": vocab, "max_position_embeddings": 256,
              "tie_word_embeddings": False, "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {"model.embed_tokens.weight": np.zeros((vocab, hidden), np.float32),
               "lm_head.weight": np.zeros((vocab, hidden), np.float32),
               "model.norm.weight": np.ones(hidden, np.float32)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({p + "self_attn.q_proj.weight": np.zeros((hidden, hidden), np.float32),
                        p + "self_attn.k_proj.weight": np.zeros((hidden // 2, hidden), np.float32),
                        p + "self_attn.v_proj.weight": np.zeros((hidden // 2, hidden), np.float32),
                        p + "self_attn.o_proj.weight": np.zeros((hidden, hidden), np.float32),
                        p + "mlp.gate_proj.weight": np.zeros((2 * hidden, hidden), np.float32),
                        p + "mlp.up_proj.weight": np.zeros((2 * hidden, hidden), np.float32),
                        p + "mlp.down_proj.weight": np.zeros((hidden, 2 * hidden), np.float32),
                        p + "input_layernorm.weight": np.ones(hidden, np.float32),
                        p + "post_attention_layernorm.weight": np.ones(hidden, np.float32)})
    save_safetensors(folder / "model.safetensors", tensors, metadata={"format": "pt"})
    template = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}, indent=2) + "\n")
    return folder


def write_fake_adapter(folder: Path, base: str, rank: int = 8, hidden: int = 64) -> Path:
    from surogate.io import save_safetensors

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "base_model_name_or_path": base, "r": rank, "lora_alpha": 2 * rank,
         "target_modules": ["q_proj", "v_proj"]}, indent=2) + "\n")
    save_safetensors(folder / "adapter_model.safetensors",
                     {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros((rank, hidden),
                                                                                                 np.float32),
                      "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": np.zeros((hidden, rank),
                                                                                                 np.float32)})
    return folder


def write_feed(path: Path, steps: int = 40, total: int = 40, gpus: int = 2, ended: bool = True,
               t0: float = 1_767_225_600.0, moe: bool = False) -> Path:
    """A run's metrics.jsonl as the trainer writes it, with fixed numbers and times (``moe``: a
    mixture-of-experts run's expert load, 8 experts over 2 layers, balancing as it trains)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"time": t0, "type": "start", "total_steps": total, "start_step": 0, "tokens_per_step": 4096,
              "output_dir": str(path.parent)}]
    for s in range(1, steps + 1):
        loss = 2.0 * np.exp(-s / 12) + 0.4 + 0.05 * np.sin(s)
        lines.append({"time": t0 + 2 * s, "type": "step", "step": s, "loss": round(float(loss), 4),
                      "lr": 2e-4 * (1 - s / total), "grad_norm": round(0.9 / (1 + s / 10), 3),
                      "tokens_per_second": 2048.0 + 8 * s, "epoch": s / 20, "elapsed": 2.0 * s})
        if moe:
            skew = 1.0 + 1.5 * np.exp(-s / 10)
            counts = [int(2048 * skew) if e == 0 else int(2048 * (8 - skew) / 7) for e in range(8)]
            mean = sum(counts) / 8
            lines[-1].update(moe_tokens_per_expert=counts, moe_load_max=max(counts), moe_load_mean=mean,
                             moe_load_imbalance=round(max(counts) / mean, 4),
                             moe_layer_imbalance=[round(max(counts) / mean, 4), round(1.1 * max(counts) / mean, 4)],
                             moe_aux_loss=round(1.0 + 0.1 * skew, 4), moe_z_loss=round(3.0 / (1 + s / 20), 4))
        if s % 10 == 0:
            lines.append({"time": t0 + 2 * s, "type": "eval", "step": s, "eval_loss": round(float(loss) + 0.1, 4)})
        if gpus and s % 20 == 0:
            lines.append({"time": t0 + 2 * s, "type": "gpu", "gpus": [
                {"index": i, "name": "NVIDIA H200", "utilization": 87.0 - 30 * i, "memory_used_mib": 51234.0,
                 "memory_total_mib": 143771.0, "temperature_c": 61.0 + i, "power_w": 512.3 - 100 * i}
                for i in range(gpus)]})
    if ended:
        last = [x for x in lines if x["type"] == "step"][-1]
        lines.append({"time": t0 + 2 * steps + 1, "type": "end", "step": steps, "loss": last["loss"],
                      "eval_loss": None, "output": str(path.parent / "adapter")})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture
def h() -> SimpleNamespace:
    """The helpers above, for test modules (conftest is not importable under --import-mode=importlib)."""
    return SimpleNamespace(drive=drive, wait_for=wait_for, settle=settle, notifications=notifications,
                           free_port=free_port, write_fake_model=write_fake_model,
                           write_fake_adapter=write_fake_adapter, write_feed=write_feed)
