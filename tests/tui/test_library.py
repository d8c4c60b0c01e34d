"""The Library screen driven by keys: what it lists (a tiny model folder with an adapter beside it,
a hub-cache entry, the packaged SmolLM2 GGUF when installed), inspect, quantize to GGUF (and its
error), delete with confirmation, merge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from textual.widgets import DataTable

from surogate.tui.catalog import default_model, format_params
from surogate.tui.screens.confirm import ConfirmScreen
from surogate.tui.screens.inspect import InspectScreen
from surogate.tui.screens.quantize import QuantizeScreen


def rows(app) -> dict[str, list[str]]:
    table = app.screen_stack[0].query_one("#models", DataTable)  # the Library, under any dialog
    out = {}
    for key in table.rows:
        cells = [str(c) for c in table.get_row(key)]
        out[cells[0]] = cells
    return out


def select(app, name: str) -> None:
    table = app.screen.query_one("#models", DataTable)
    names = list(rows(app))
    table.move_cursor(row=names.index(name))


def transformers_params(config: dict) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def fake_hub_repo(cache, repo_id: str, config: dict) -> None:
    """One cached model as huggingface_hub lays it out: blobs, a snapshot of links, refs/main."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    snap.mkdir(parents=True)
    blob = repo / "blobs" / "c0ffee"
    blob.write_text(json.dumps(config))
    (snap / "config.json").symlink_to(blob)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snap.name)


def test_lists_models_adapters_hub_cache_and_default_gguf(world, settings, make_app, h):
    tiny_models = pytest.importorskip("sgtest.tiny_models")
    pytest.importorskip("transformers")
    tiny_models.make_llama(world / "models" / "tiny-llama", seed=3)
    h.write_fake_adapter(world / "models" / "tiny-lora", base="models/tiny-llama")
    hub_config = {"model_type": "qwen3", "hidden_size": 256, "num_hidden_layers": 4, "vocab_size": 1000,
                  "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                  "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
    fake_hub_repo(Path(settings.hf_cache), "org/hubby", hub_config)
    gguf = default_model()
    app = make_app("library", include_default_model=True)

    async def script(pilot):
        await h.wait_for(pilot, lambda: len(rows(app)) >= (3 if gguf else 2), what="the scan")
        listed = rows(app)
        name, arch, params, dtype, size, lora = listed["tiny-llama"]
        assert (arch, dtype, lora) == ("llama", "float32", "1")  # the adapter beside it
        assert params.endswith("K") and size.endswith("KB")
        # no weights in the cache: the count comes from config.json, as transformers would build it
        assert listed["org/hubby"][1:4] == ["qwen3", format_params(transformers_params(hub_config)), "bfloat16"]
        if gguf is not None:
            assert listed["SmolLM2-135M-Instruct (gguf)"][1:4] == ["llama", "135M", "Q4_1"]
        assert not any("(adapter)" in n for n in listed)

        select(app, "tiny-llama")
        await pilot.press("i")
        await h.wait_for(pilot, lambda: isinstance(app.screen, InspectScreen)
                         and app.screen.query_one("#inspect-tensors", DataTable).row_count > 0)
        assert app.screen.query_one("#inspect-tensors", DataTable).row_count == 21  # 2 layers x 9 + 3
        await pilot.press("escape")
        await h.wait_for(pilot, lambda: not isinstance(app.screen, InspectScreen))

        await pilot.press("k")  # quantize: the dialog offers Q8_0 beside the folder
        await h.wait_for(pilot, lambda: isinstance(app.screen, QuantizeScreen))
        assert app.screen.query_one("#quant-output").value == "models/tiny-llama.Q8_0.gguf"
        await pilot.press("enter")
        await h.wait_for(pilot, lambda: "tiny-llama.Q8_0.gguf (gguf)" in rows(app), timeout=60,
                         what="the quantized file in the list")
        assert rows(app)["tiny-llama.Q8_0.gguf (gguf)"][1:4] == ["llama", listed["tiny-llama"][2], "Q8_0"]

    h.drive(app, script)


def test_quantize_error_delete_and_merge_without_adapter(world, settings, make_app, h):
    h.write_fake_model(world / "models" / "keep")
    h.write_fake_model(world / "models" / "doomed")
    app = make_app("library")

    async def script(pilot):
        await h.wait_for(pilot, lambda: len(rows(app)) == 2)
        select(app, "keep")  # zero weights and no tokenizer: quantize says what is missing
        await pilot.press("k")
        await h.wait_for(pilot, lambda: isinstance(app.screen, QuantizeScreen))
        await pilot.click("#quantize")
        await h.wait_for(pilot, lambda: any("no tokenizer.json" in n for n in h.notifications(app)), timeout=60,
                         what="quantize's error")
        assert any(n.startswith("error: no tokenizer.json in") and "hint:" in n for n in h.notifications(app))

        select(app, "doomed")
        await pilot.press("d")
        await h.wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")  # no: nothing happens
        await pilot.pause(0.2)
        assert (world / "models" / "doomed").is_dir()
        await pilot.press("d")
        await h.wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await h.wait_for(pilot, lambda: list(rows(app)) == ["keep"], what="the rescan after delete")
        assert not (world / "models" / "doomed").exists()

        await pilot.press("m")  # no adapter beside "keep"
        await h.wait_for(pilot, lambda: any("No adapter" in n for n in h.notifications(app)))

    h.drive(app, script)


def test_merges_an_adapter_trained_elsewhere(world, make_app, h, tmp_path):
    """An adapter from a real training run (the Train test writes one too) merged from the Library."""
    tiny_models = pytest.importorskip("sgtest.tiny_models")
    pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    torch = pytest.importorskip("torch")
    base = tiny_models.make_llama(world / "models" / "base", seed=4)
    from transformers import AutoModelForCausalLM

    model = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(str(base)),
                                peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                init_lora_weights=False))
    model.save_pretrained(str(world / "models" / "base-lora"))
    cfg = json.loads((world / "models" / "base-lora" / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"]
    app = make_app("library")

    async def script(pilot):
        await h.wait_for(pilot, lambda: "base" in rows(app))
        assert rows(app)["base"][5] == "1"
        select(app, "base")
        await pilot.press("m")
        await h.wait_for(pilot, lambda: app.screen.query("#merge-output"))
        assert app.screen.query_one("#merge-output").value == "models/base-lora-merged"
        await pilot.click("#merge")
        await h.wait_for(pilot, lambda: "base-lora-merged" in rows(app), timeout=60, what="the merged model")

    h.drive(app, script)
    assert (world / "models" / "base-lora-merged" / "model.safetensors").is_file()
    del torch


def test_download_offline_fails_with_a_hint(world, make_app, h, monkeypatch):
    import huggingface_hub.constants

    from surogate.tui.screens.download import DownloadScreen

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # as on a box with no network
    app = make_app("library")

    async def script(pilot):
        await pilot.press("g")
        await h.wait_for(pilot, lambda: isinstance(app.screen, DownloadScreen))
        await pilot.press(*"org/some-model", "enter")
        await h.wait_for(pilot, lambda: any(n.startswith("Cannot find") for n in h.notifications(app)),
                         what="the failure")
        [note] = h.notifications(app)
        assert "hint: check the id and the network" in note
        await pilot.press("escape")
        await h.wait_for(pilot, lambda: not isinstance(app.screen, DownloadScreen))

    h.drive(app, script)


def test_add_a_model_folder_from_the_palette(world, settings, make_app, h):
    from textual.command import CommandPalette
    from textual.widgets import Input

    h.write_fake_model(world / "elsewhere" / "found-me")
    app = make_app("library")

    async def script(pilot):
        await h.wait_for(pilot, lambda: not app.screen_stack[0].workers)
        assert "found-me" not in rows(app)
        await pilot.press("ctrl+p")
        await h.wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
        await pilot.press(*"add a model folder")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await h.wait_for(pilot, lambda: app.screen.query("#ask-input"), what="the folder prompt")
        app.screen.query_one("#ask-input", Input).value = "elsewhere"
        await pilot.press("enter")
        await h.wait_for(pilot, lambda: "found-me" in rows(app), what="the rescan")

    h.drive(app, script)
    assert 'model_folders = ["models", "output", "elsewhere"]' in settings.path.read_text()
