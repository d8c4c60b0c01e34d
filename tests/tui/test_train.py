"""The Train screen: the form's errors shown inline (load_config's messages), a real tiny
training run on the CPU launched from the form, paused and resumed, charted live; runs found on
disk; pause / resume / stop of a run's process group; reattaching after a restart."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from surogate.tui.processes import TrainProcess, process_start_time
from surogate.tui.screens.confirm import ConfirmScreen
from surogate.tui.settings import RunRecord, RunStore
from surogate.tui.widgets.line_plot import LinePlot

QA = [("What is the capital of France?", "Paris."), ("Name a primary color.", "Red."),
      ("What is 2 + 2?", "4."), ("Say hello.", "Hello!")]


def status(app) -> str:
    return str(app.screen.query_one("#config-status", Static).render())


async def fill(pilot, values: dict[str, str]) -> None:
    """Type into the form's fields as a user does (focus, then a new value)."""
    screen = pilot.app.screen
    for key, value in values.items():
        widget = screen.query_one(f"#f-{key}")
        widget.focus()
        await pilot.pause()
        widget.value = value
        await pilot.pause()


def test_form_shows_load_configs_error_inline(world, make_app, h):
    app = make_app("train")

    async def script(pilot):
        await fill(pilot, {"model": "models/x", "dataset_path": "data.jsonl", "lora_rank": "sixteen"})
        await h.wait_for(pilot, lambda: "lora_rank" in status(app), what="the inline error")
        assert "lora_rank: expected an integer, got 'sixteen'" in status(app)
        assert app.screen.query_one("#f-lora_rank").has_class("error")
        await fill(pilot, {"lora_rank": "8", "learning_rate": "-1"})
        await h.wait_for(pilot, lambda: "learning_rate" in status(app))
        assert "hint: LoRA typically uses 1e-4 to 3e-4" in status(app)
        assert not app.screen.query_one("#f-lora_rank").has_class("error")
        await fill(pilot, {"learning_rate": "2e-4"})
        await h.wait_for(pilot, lambda: status(app).startswith("✓ sft · models/x"))

    h.drive(app, script)


def write_qa(world) -> None:
    pytest.importorskip("transformers")
    tiny_models = pytest.importorskip("sgtest.tiny_models")
    tiny_models.make_llama(world / "models" / "tiny", seed=2)
    with open(world / "qa.jsonl", "w") as f:
        for q, a in QA:
            f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
                    + "\n")


async def launch_from_form(pilot, h, max_steps: int):
    screen = pilot.app.screen
    await fill(pilot, {"model": "models/tiny", "dataset_path": "qa.jsonl", "dataset_type": "messages",
                       "output_dir": "output/tiny-run", "recipe": "fp32", "lora_rank": "8", "lora_alpha": "16",
                       "learning_rate": "1e-2", "max_steps": str(max_steps), "sequence_len": "256",
                       "per_device_train_batch_size": "2", "gradient_accumulation_steps": "1",
                       "save_as": "configs/tiny.yaml"})
    await h.wait_for(pilot, lambda: status(pilot.app).startswith("✓ sft"), what="a valid form")
    await pilot.press("ctrl+l")
    await h.wait_for(pilot, lambda: screen.attached is not None, what="the launch")
    assert screen.query_one("#train-tabs").active == "tab-monitor"
    return screen.attached.process


def test_launches_a_real_run_and_charts_the_loss_to_the_end(world, make_app, h):
    write_qa(world)
    app = make_app("train")

    async def script(pilot):
        screen = app.screen
        process = await launch_from_form(pilot, h, max_steps=5)
        plot = screen.query_one("#loss-plot", LinePlot)
        await h.wait_for(pilot, lambda: screen.state in ("finished", "failed"), timeout=180, what="the end")
        assert screen.state == "finished", Path(process.record.log_path).read_text()[-2000:]
        assert screen.metrics.step == 5 and len(screen.metrics.losses) == 5
        assert plot.point_count >= 5  # the train losses, and the eval point
        assert "loss" in str(plot.render())  # the legend under the chart
        assert any("tiny-run finished: loss" in n for n in h.notifications(app))
        await pilot.press("r")
        table = screen.query_one("#runs", DataTable)
        await h.wait_for(pilot, lambda: table.row_count == 1)
        assert [str(c) for c in table.get_row_at(0)][:3] == ["tiny-run", "finished", "5/5"]

    h.drive(app, script)
    assert (world / "configs" / "tiny.yaml").is_file()
    assert (world / "output" / "tiny-run" / "adapter" / "adapter_config.json").is_file()
    [record] = RunStore(app.settings.folder).load()
    assert record.kind == "sft" and record.output_dir == str(world / "output" / "tiny-run")


def test_pauses_resumes_and_stops_a_launched_run(world, make_app, h):
    # A run far longer than the test, so that it cannot end before the pause lands (a 5-step run
    # on a loaded 2-core box finished before the key was handled).
    write_qa(world)
    app = make_app("train")

    async def script(pilot):
        screen = app.screen
        process = await launch_from_form(pilot, h, max_steps=100_000)
        screen.query_one("#train-tabs Tabs").focus()
        await pilot.press("p")
        await h.wait_for(pilot, lambda: screen.state == "paused", what=lambda: f"the paused state (now {screen.state})")
        assert process.state == "paused"
        feed = world / "output" / "tiny-run" / "metrics.jsonl"
        size = feed.stat().st_size if feed.exists() else 0
        await pilot.pause(1.0)
        assert (feed.stat().st_size if feed.exists() else 0) == size  # stopped: it writes nothing
        await pilot.press("p")
        await h.wait_for(pilot, lambda: screen.state == "running", what="the resumed state")
        plot = screen.query_one("#loss-plot", LinePlot)
        await h.wait_for(pilot, lambda: plot.point_count > 0, timeout=180, what="points on the loss chart")
        screen.query_one("#train-tabs Tabs").focus()
        await pilot.press("x")  # stop: a confirmation first
        await h.wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
        await pilot.press("y")
        await h.wait_for(pilot, lambda: screen.state == "stopped", timeout=60,
                         what=lambda: f"the stopped state (now {screen.state}, process {process.state})")
        assert process.popen.wait(timeout=10) < 0

    h.drive(app, script)
    [record] = RunStore(app.settings.folder).load()
    assert record.stopped


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)


def record_for(popen: subprocess.Popen, world, name: str = "live") -> RunRecord:
    return RunRecord(id=f"20260101-000000-{name}", kind="sft", config=str(world / "configs" / "x.yaml"),
                     output_dir=str(world / "output" / name),
                     metrics_path=str(world / "output" / name / "metrics.jsonl"),
                     log_path=str(world / "x.log"), pid=popen.pid, pid_start=process_start_time(popen.pid),
                     started=1_767_225_600.0)


def test_pause_resume_stop_signal_the_process_group(world):
    popen = sleeper()
    store = RunStore(world / "home")
    record = record_for(popen, world)
    store.add(record)
    try:
        run = TrainProcess(record)  # as reattached: no Popen, only the pid and its start time
        assert run.state == "running"
        run.pause()
        time.sleep(0.2)
        assert run.state == "paused"
        run.resume()
        time.sleep(0.2)
        assert run.state == "running"
        run.pause()  # stop works on a paused run too (SIGCONT follows the SIGTERM)
        assert run.stop(store, grace=5) == "stopped"
        assert popen.wait(timeout=5) == -15
        assert run.state == "stopped" and store.load()[0].stopped
    finally:
        popen.kill()
        popen.wait()


def test_a_reused_pid_is_not_the_run(world):
    popen = sleeper()
    try:
        record = record_for(popen, world)
        record.pid_start = (record.pid_start or 0) + 1  # the pid now belongs to another process
        assert TrainProcess(record).state == "exited"
    finally:
        popen.kill()
        popen.wait()


def test_reattaches_to_a_running_run_after_a_restart(world, make_app, h):
    popen = sleeper()
    try:
        record = record_for(popen, world)
        h.write_feed(world / "output" / "live" / "metrics.jsonl", steps=7, total=40, gpus=1, ended=False)
        RunStore(make_app().settings.folder).add(record)
        app = make_app("train")

        async def script(pilot):
            screen = app.screen
            await h.wait_for(pilot, lambda: screen.attached is not None, what="the reattach")
            await h.wait_for(pilot, lambda: screen.metrics.step == 7)
            assert screen.state == "running"
            assert any(n.startswith("Reattached to 20260101-000000-live") for n in h.notifications(app))
            assert screen.query_one("#loss-plot", LinePlot).point_count == 7
            screen.query_one("#train-tabs Tabs").focus()
            await pilot.press("x")  # stop: a confirmation first
            await h.wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
            await pilot.press("y")
            await h.wait_for(pilot, lambda: screen.state == "stopped", timeout=20, what="the stopped state")

        h.drive(app, script)
        assert popen.wait(timeout=5) == -15
    finally:
        popen.kill()
        popen.wait()


def test_lists_runs_found_on_disk(world, make_app, h):
    h.write_feed(world / "output" / "a" / "metrics.jsonl")
    h.write_feed(world / "output" / "nested" / "b" / "metrics.jsonl", steps=3, ended=False)
    app = make_app("train")

    async def script(pilot):
        table = app.screen.query_one("#runs", DataTable)
        await h.wait_for(pilot, lambda: table.row_count == 2)
        got = {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)] for i in range(2)}
        assert got["a"][1:5] == ["finished", "40/40", "0.5086", "0.6086"]
        assert got["nested/b"][1:3] == ["incomplete", "3/40"]

    h.drive(app, script)


def test_a_failing_worker_is_a_notification_not_a_crash(world, make_app, h, monkeypatch):
    from surogate.errors import NotFoundError
    from surogate.tui.screens import train

    def boom(folders):
        raise NotFoundError("the configs folder vanished", hint="create it again")

    monkeypatch.setattr(train, "find_configs", boom)
    app = make_app("train")

    async def script(pilot):
        await h.wait_for(pilot, lambda: h.notifications(app), what="the error notification")
        assert h.notifications(app) == ["the configs folder vanished\nhint: create it again"]
        await pilot.press("3")  # and the app is still there
        assert app.current_mode == "serve"

    h.drive(app, script)
