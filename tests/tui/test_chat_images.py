"""Images in the Chat screen: ``/image PATH`` and ctrl+o attach local files (listed with name,
size and pixels above the prompt, ``/detach N`` removes them); a missing file, a folder, a file
that is no image, one too large, or one that changed since it was attached is refused with a
message naming it and nothing is sent. Sent, each file goes as an ``image_url`` data URL of its
exact bytes, and again with the history. Against a real gateway serving a tiny Gemma 3 vision
model and a text-only Llama: the vision model's answer and prompt length equal transformers'
on Gemma3Processor's inputs, the text-only model's 400 names the image part, and that failed
turn is not sent again."""

from __future__ import annotations

import base64
import functools
import json
from pathlib import Path

import httpx
import pytest
from textual.widgets import Input, Select

from surogate.tui import attachments, gateway_client
from surogate.tui.screens import chat as chat_screen
from surogate.tui.widgets.chat_message import ChatMessage

GOLDEN = Path(__file__).resolve().parents[1] / "gateway" / "golden"


def write_images(folder: Path) -> dict[str, Path]:
    from sgtest.vision import image

    paths = {"png": folder / "cat.png", "jpg": folder / "dog.jpg", "txt": folder / "notes.txt"}
    image(1, (40, 30)).save(paths["png"])
    image(2, (24, 64)).save(paths["jpg"], quality=90)
    paths["txt"].write_text("not an image\n")
    (folder / "pics").mkdir()
    return paths


def recording_client(bodies: list[dict]) -> httpx.Client:
    sse = (GOLDEN / "chat_tools_reasoning.sse").read_bytes()

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"})

    return httpx.Client(transport=httpx.MockTransport(handler))


def data_url_bytes(part: dict) -> tuple[str, bytes]:
    assert part["type"] == "image_url"
    head, _, data = part["image_url"]["url"].partition(",")
    return head, base64.b64decode(data)


def test_attach_list_detach_refuse_and_send_images(world, make_app, h, monkeypatch):
    pytest.importorskip("PIL")
    paths = write_images(world)
    bodies: list[dict] = []
    monkeypatch.setattr(chat_screen, "stream_chat", functools.partial(gateway_client.stream_chat,
                                                                      client=recording_client(bodies)))
    monkeypatch.setattr(chat_screen, "list_models", lambda url: ["tiny"])
    app = make_app("chat")

    async def type_line(pilot, text):
        await pilot.press(*text, "enter")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()

    def last_note() -> str:
        return h.notifications(app)[-1] if h.notifications(app) else ""

    async def script(pilot):
        chat = app.screen
        await h.wait_for(pilot, lambda: chat.query_one("#chat-model").value == "tiny")
        bar = chat.query_one("#attachments")
        assert not bar.display

        await type_line(pilot, "/image cat.png")
        assert [a.name for a in chat.attachments] == ["cat.png"]
        size = paths["png"].stat().st_size
        assert chat.attachments[0].size == size and (chat.attachments[0].width, chat.attachments[0].height) == (40, 30)
        assert bar.display and f"[1] cat.png ({attachments.human_bytes(size)}, 40x30)" in str(bar.render())
        assert chat.query_one("#prompt", Input).value == ""

        for line, said in (("/image notes.txt", "is not a PNG, JPEG, WebP or GIF image"),
                           ("/image missing.png", "missing.png does not exist"),
                           ("/image pics", "is a folder, not an image file"),
                           ("/image cat.png", "cat.png is attached already")):
            await type_line(pilot, line)
            assert said in last_note(), (line, h.notifications(app))
        monkeypatch.setattr(attachments, "MAX_IMAGE_BYTES", size - 1)
        await type_line(pilot, "/image ~/../work/cat.png")  # the same file by another path: too large now
        assert "more than the" in last_note() and "an attached image may be" in last_note()
        monkeypatch.setattr(attachments, "MAX_IMAGE_BYTES", 20 * 1024 * 1024)
        assert len(chat.attachments) == 1

        await pilot.press("ctrl+o")  # the path prompt
        await pilot.pause()
        assert type(app.screen).__name__ == "AskScreen"
        await pilot.press(*"dog.jpg", "enter")
        await h.wait_for(pilot, lambda: len(chat.attachments) == 2, what="the second image")
        assert chat.focused is chat.query_one("#prompt")
        await type_line(pilot, "/detach 3")
        assert "expected a number from 1 to 2" in last_note() and len(chat.attachments) == 2
        assert chat.query_one("#prompt", Input).value == "/detach 3"  # kept, to be corrected
        chat.query_one("#prompt", Input).value = ""
        await type_line(pilot, "/detach 1")
        assert [a.name for a in chat.attachments] == ["dog.jpg"] and "[1] dog.jpg" in str(bar.render())
        await type_line(pilot, "/image 'cat.png'")  # a pasted, quoted path

        await type_line(pilot, "What are these?")
        await h.wait_for(pilot, lambda: len(chat.query(ChatMessage)) == 2 and not chat.streaming, what="the answer")
        assert len(bodies) == 1
        (turn,) = bodies[0]["messages"]
        assert turn["role"] == "user" and [p["type"] for p in turn["content"]] == ["image_url", "image_url", "text"]
        assert turn["content"][2]["text"] == "What are these?"
        assert data_url_bytes(turn["content"][0]) == ("data:image/jpeg;base64", paths["jpg"].read_bytes())
        assert data_url_bytes(turn["content"][1]) == ("data:image/png;base64", paths["png"].read_bytes())
        question = chat.query(ChatMessage).first()
        assert [label.split(" (")[0] for label, _ in question.images] == ["dog.jpg", "cat.png"]
        assert "image: dog.jpg" in str(question.query_one(".images").render())
        assert not chat.attachments and not bar.display

        await type_line(pilot, "And now?")  # the history sends the images again
        await h.wait_for(pilot, lambda: len(bodies) == 2 and not chat.streaming, what="the second answer")
        first, _, now = bodies[1]["messages"]
        assert first == turn and now == {"role": "user", "content": "And now?"}

        await type_line(pilot, "/image cat.png")
        paths["png"].write_text("changed after it was attached")
        await type_line(pilot, "Still there?")
        assert "cat.png is not a PNG, JPEG, WebP or GIF image" in last_note()
        assert len(bodies) == 2 and len(chat.query(ChatMessage)) == 4  # nothing sent
        assert chat.query_one("#prompt", Input).value == "Still there?" and len(chat.attachments) == 1
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert not chat.attachments and not bar.display and not chat.query(ChatMessage)

    h.drive(app, script)


def test_check_image_reads_the_header_only_and_encodes_the_file(world, tmp_path):
    pytest.importorskip("PIL")
    from PIL import Image

    paths = write_images(world)
    att = attachments.check_image(paths["jpg"])
    assert (att.format, att.width, att.height, att.size) == ("JPEG", 24, 64, paths["jpg"].stat().st_size)
    part, now = attachments.image_part(att)
    assert now == att and data_url_bytes(part)[1] == paths["jpg"].read_bytes()
    big = world / "big.png"  # a header of 9000 x 8000 pixels: refused before any pixel is read
    Image.new("L", (9000, 8000)).save(big)
    with pytest.raises(Exception, match="9000 x 8000 pixels, more than"):
        attachments.check_image(big)
    with pytest.raises(Exception, match="more than the 24.0 MiB one request may carry"):
        attachments.check_request_size(attachments.MAX_REQUEST_BYTES + 1)


@pytest.mark.slow
def test_images_to_a_served_vision_model_and_a_text_only_model(world, make_app, h, tmp_path):
    pytest.importorskip("granian")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tiny_models = pytest.importorskip("sgtest.tiny_models")
    from sgtest.server import surogate_serve
    from sgtest.vision import hf_generate, image, make_gemma3_vision_chat

    vision = make_gemma3_vision_chat(tmp_path / "g3v", seed=3)
    text_only = tiny_models.make_llama(tmp_path / "tiny", seed=5)
    pic = image(40, (40, 30))
    pic.save(world / "photo.png")
    n = 6
    ref = transformers.Gemma3ForConditionalGeneration.from_pretrained(str(vision), dtype=torch.float32).eval()
    processor = transformers.AutoProcessor.from_pretrained(str(vision))
    ids, prompt = hf_generate(ref, processor, [{"role": "user", "content": [
        {"type": "image", "image": pic}, {"type": "text", "text": "Describe it."}]}], n, ignore_eos=False)
    want = processor.tokenizer.decode(ids, skip_special_tokens=True)

    with surogate_serve(f"g3v={vision}", f"tiny={text_only}", "--kv-cache-tokens", "2048") as base:
        app = make_app("chat")

        async def script(pilot):
            chat = app.screen
            chat.set_url(base)
            select = chat.query_one("#chat-model", Select)
            await h.wait_for(pilot, lambda: not select.is_blank(), what="the model list")
            chat.query_one("#max-tokens").value = str(n)
            chat.query_one("#temperature").value = "0"
            chat.query_one("#prompt").focus()

            select.value = "tiny"  # no vision encoder: the gateway's 400, shown as the screen shows errors
            await pilot.press(*"/image photo.png", "enter")
            await h.wait_for(pilot, lambda: len(chat.attachments) == 1, what="the attachment")
            await pilot.press(*"Describe it.", "enter")
            await h.wait_for(pilot, lambda: len(chat.query(ChatMessage)) == 2 and not chat.streaming, timeout=60,
                             what="the refusal")
            refused = chat.query(ChatMessage).last()
            assert refused.footer.startswith("error: HTTP 400") and "messages[0].content[0]" in refused.footer
            assert any("HTTP 400" in note for note in h.notifications(app))

            select.value = "g3v"  # the same turn to the vision model; the refused one is not sent again
            await pilot.press(*"/image photo.png", "enter")
            await h.wait_for(pilot, lambda: len(chat.attachments) == 1, what="the attachment")
            await pilot.press(*"Describe it.", "enter")
            await h.wait_for(pilot, lambda: len(chat.query(ChatMessage)) == 4 and not chat.streaming, timeout=120,
                             what="the answer")
            answer = chat.query(ChatMessage).last()
            assert answer.footer.startswith("finish: "), answer.footer
            assert answer.content == want and want, (answer.content, want)
            assert f"{len(prompt)} prompt + {len(ids)} completion tokens" in answer.footer

        h.drive(app, script)
