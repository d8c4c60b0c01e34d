"""Every screen as it looks, at 80x24 (an SSH session's default) and 120x40, against the SVGs in
snapshots/tui/. Update them after a deliberate change with `pytest tests/tui --snapshot-update`
and look at the report before committing."""

from __future__ import annotations

import pytest

pytest.importorskip("pytest_textual_snapshot")

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((120, 40), id="120x40")]


@pytest.fixture
def library_world(world, h):
    h.write_fake_model(world / "models" / "llama-tiny")
    h.write_fake_model(world / "models" / "llama-wide", layers=4, hidden=128, vocab=1024)
    h.write_fake_adapter(world / "output" / "chat-run" / "adapter", base="models/llama-tiny")
    h.write_fake_adapter(world / "output" / "orphan" / "adapter", base="org/not-here", rank=16)
    return world


@pytest.fixture
def train_world(world, h):
    h.write_feed(world / "output" / "demo" / "metrics.jsonl")
    h.write_feed(world / "output" / "short" / "metrics.jsonl", steps=12, total=40, gpus=0, ended=False,
               t0=1_767_312_000.0)
    (world / "configs" / "demo.yaml").write_text("model: models/llama-tiny\ndatasets:\n  - path: data.jsonl\n")
    return world


@pytest.mark.parametrize("size", SIZES)
def test_library(snap_compare, make_app, library_world, h, size):
    assert snap_compare(make_app("library"), terminal_size=size, run_before=h.settle)


@pytest.mark.parametrize("size", SIZES)
def test_inspect(snap_compare, make_app, library_world, h, size):
    async def run_before(pilot):
        await h.settle(pilot)
        await pilot.press("i")
        await h.settle(pilot)

    assert snap_compare(make_app("library"), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_train_config(snap_compare, make_app, train_world, h, size):
    assert snap_compare(make_app("train"), terminal_size=size, run_before=h.settle)


@pytest.mark.parametrize("size", SIZES)
def test_train_runs(snap_compare, make_app, train_world, h, size):
    async def run_before(pilot):
        await h.settle(pilot)
        await pilot.press("r")
        await h.settle(pilot)

    assert snap_compare(make_app("train"), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_train_monitor(snap_compare, make_app, train_world, h, size):
    async def run_before(pilot):
        await h.settle(pilot)
        await pilot.press("r", "enter")  # attach the newest run found: output/demo
        await h.settle(pilot)

    assert snap_compare(make_app("train"), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_train_monitor_moe(snap_compare, make_app, world, h, size):
    """A mixture-of-experts run: the expert-load chart under the loss chart, its numbers beside."""
    h.write_feed(world / "output" / "moe" / "metrics.jsonl", moe=True)

    async def run_before(pilot):
        await h.settle(pilot)
        await pilot.press("r", "enter")
        await h.settle(pilot)

    assert snap_compare(make_app("train"), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_serve(snap_compare, make_app, library_world, h, size):
    async def run_before(pilot):
        await h.settle(pilot)
        pilot.app.screen.set_model(str(library_world / "models" / "llama-tiny"))
        pilot.app.screen.query_one("#serve-port").value = "8000"
        await h.settle(pilot)

    assert snap_compare(make_app("serve"), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_serve_running_with_adapters(snap_compare, make_app, library_world, h, size):
    from surogate.tui.gateway_client import ServerStats
    from surogate.tui.screens.serve import ServeScreen

    async def run_before(pilot):
        await h.settle(pilot)
        screen = pilot.app.screen
        screen.set_model(str(library_world / "models" / "llama-tiny"))
        screen.query_one("#serve-port").value = "8000"
        screen.state = "running"
        screen.post_message(ServeScreen.Stats(ServerStats(
            healthy=True, models={"llama-tiny": "loaded"}, running=1, waiting=0, kv_usage=0.25,
            prefix_hit_rate=0.5, generation_tps=42.0, prompt_tps=310.0, requests=7,
            adapters={"chat-run": "llama-tiny", "sql": "llama-tiny"})))
        screen.query_one("#serve-lora").value = "orphan=output/orphan/adapter"
        await h.settle(pilot)

    assert snap_compare(make_app("serve"), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_chat(snap_compare, make_app, world, h, size):
    from surogate.tui.widgets.chat_message import ChatMessage

    async def run_before(pilot):
        await h.settle(pilot)
        screen = pilot.app.screen
        screen.query_one("#chat-url").value = "http://127.0.0.1:8000"
        transcript = screen.query_one("#transcript")
        await transcript.mount(ChatMessage("user", "What's the weather in Paris?"))
        answer = ChatMessage("assistant")
        await transcript.mount(answer)
        answer.add_reasoning("The user asks for the weather; I should call the tool.")
        answer.add_tool_call(0, "get_weather", '{"city": "Paris"}')
        answer.add_content("Let me check the weather in Paris for you.")
        answer.finish("finish: tool_calls · tiny · 0.4 s · 31 prompt + 19 completion tokens · 47.5 tok/s")
        await h.settle(pilot)

    assert snap_compare(make_app("chat"), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_chat_with_images(snap_compare, make_app, world, h, size):
    """A turn that carried two images, and one attached to the next message (the list above the prompt)."""
    from surogate.tui.attachments import Attachment
    from surogate.tui.widgets.chat_message import ChatMessage

    async def run_before(pilot):
        await h.settle(pilot)
        screen = pilot.app.screen
        screen.query_one("#chat-url").value = "http://127.0.0.1:8000"
        transcript = screen.query_one("#transcript")
        part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,"}}
        await transcript.mount(ChatMessage("user", "Which one is the cat?", images=[
            ("cat.png (3.6 KiB, 40x30)", part), ("dog.jpg (1.2 KiB, 24x64)", part)]))
        answer = ChatMessage("assistant")
        await transcript.mount(answer)
        answer.add_content("The first one.")
        answer.finish("finish: stop · g3v · 0.3 s · 540 prompt + 4 completion tokens · 13.3 tok/s")
        screen.post_message(screen.Attached(Attachment(world / "cat.png", 3686, "PNG", 40, 30)))
        await h.settle(pilot)

    assert snap_compare(make_app("chat"), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_help(snap_compare, make_app, world, h, size):
    async def run_before(pilot):
        await h.settle(pilot)
        await pilot.press("f1")
        await h.settle(pilot)

    assert snap_compare(make_app("library"), terminal_size=size, run_before=run_before)
