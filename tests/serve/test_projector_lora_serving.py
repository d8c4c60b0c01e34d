"""LoRA adapters that trained the multimodal projector (train_projector: peft's modules_to_save)
served per request, on tiny random Gemma 3, Qwen3-VL and Qwen3-VL-MoE folders (sgtest/vision.py)
with adapters in peft's layout (sgtest/projector_lora.py):

- an image request naming the adapter gives the greedy tokens of transformers + peft on the adapter,
  and those of serving the merged model (`surogate merge`); a base request those of transformers;
  an adapter with the same LoRA and no projector those of peft on it (and other tokens: the
  projector matters);
- the three in one batch over one image: each gets its own rows (the adapter with a projector its
  own encode and EmbedSpan keys; the one without shares the base's), also from the prefix cache;
- the encoder's tower calls take one projector's images at a time; an adapter loaded at run time
  serves after a sleep too, and unloading it drops its projector and its cached rows;
- a projector that does not fit the base model (a shape, a tensor it lacks) is refused, naming the
  tensor, before anything is kept.
"""

from __future__ import annotations

import json
import shutil
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from sgtest.projector_lora import peft_reference, write_projector_adapter  # noqa: E402
from sgtest.vision import (hf_generate, image, make_gemma3_vision_chat, make_qwen3_vl_chat,  # noqa: E402
                           qwen3_vl_reference, template_messages, user)
from surogate.errors import InvalidArgumentError  # noqa: E402
from surogate.serve import SamplingParams  # noqa: E402
from surogate.serve.launch import launch  # noqa: E402

N = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True)


class Case:
    """One family's base folder, its adapters and transformers' answers for them."""

    def __init__(self, family: str, root):
        self.family = family
        if family == "gemma3":
            self.folder = make_gemma3_vision_chat(root / "base", seed=3)
            targets = ("q_proj", "v_proj", "down_proj")
        else:
            self.folder = make_qwen3_vl_chat(root / "base", seed=4, moe=family == "qwen3_vl_moe")
            targets = ("q_proj", "v_proj")
        self.adapter = write_projector_adapter(self.folder, root / "proj", seed=1, targets=targets)
        self.lora_only = root / "lora"  # the same LoRA, the projector left out
        shutil.copytree(self.adapter, self.lora_only)
        from safetensors.numpy import load_file, save_file

        tensors = load_file(self.lora_only / "adapter_model.safetensors")
        save_file({k: v for k, v in tensors.items() if "lora_" in k}, self.lora_only / "adapter_model.safetensors",
                  metadata={"format": "pt"})
        config = json.loads((self.lora_only / "adapter_config.json").read_text())
        (self.lora_only / "adapter_config.json").write_text(json.dumps({**config, "modules_to_save": None}))
        self._refs = {}

    def reference(self, adapter=None):
        """messages -> transformers' (+ peft's on ``adapter``) greedy tokens."""
        if adapter not in self._refs:
            if self.family == "gemma3":
                model = (peft_reference(self.folder, adapter) if adapter is not None else
                         transformers.Gemma3ForConditionalGeneration.from_pretrained(str(self.folder),
                                                                                     dtype=torch.float32).eval())
                processor = transformers.AutoProcessor.from_pretrained(str(self.folder))
                self._refs[adapter] = lambda messages: hf_generate(model, processor, messages, N)[0]
            else:
                gen = qwen3_vl_reference(self.folder, adapter)[1]
                self._refs[adapter] = lambda messages: gen(messages, N)[0]
        return self._refs[adapter]


@pytest.fixture(scope="module", params=["gemma3", "qwen3_vl", "qwen3_vl_moe"])
def case(request, tmp_path_factory):
    return Case(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def served(case):
    m = launch(str(case.folder), kv_cache_tokens=2048, loras={"proj": str(case.adapter), "lora": str(case.lora_only)})
    yield m
    m.client.close()


def answer(llm, messages, adapter=None):
    chat, images = template_messages(messages)
    return llm.chat(chat, GREEDY, images=images, adapter=adapter).result(timeout=120)[0].new_token_ids


def pic(seed: int):
    return image(seed, (32, 48))


def test_adapter_requests_equal_peft_and_the_merged_model(case, served, tmp_path):
    from surogate.train.export import merge_adapter

    llm = served.llm()
    messages = user("Describe the picture", pic(10))
    got = {name: answer(llm, messages, name) for name in (None, "proj", "lora")}
    assert got[None] == case.reference()(messages)
    assert got["proj"] == case.reference(case.adapter)(messages)
    assert got["lora"] == case.reference(case.lora_only)(messages)
    assert got["proj"] != got["lora"]  # the adapter's projector, not the base one, made its image rows
    merged = launch(str(merge_adapter(str(case.folder), case.adapter, tmp_path / "merged")), kv_cache_tokens=2048)
    try:
        assert answer(merged.llm(), messages) == got["proj"]
    finally:
        merged.client.close()
    text = user("Say something")  # a text request of the adapter: its LoRA alone
    assert answer(llm, text, "proj") == answer(llm, text, "lora") == case.reference(case.adapter)(text)


def test_base_and_adapters_in_one_batch_each_get_their_own_rows(case, served):
    llm, enc = served.llm(), served.images
    messages = user("What is this?", pic(20))
    want = {None: case.reference()(messages), "proj": case.reference(case.adapter)(messages),
            "lora": case.reference(case.lora_only)(messages)}
    chat, images = template_messages(messages)
    prompt = llm.render(chat, images=images)
    for warm in (False, True):
        before = enc.encodes
        with served.client.held():  # all three reach the engine's first step together
            gens = {name: llm.submit(prompt, GREEDY, adapter=name) for name in want}
        outs = {name: g.result(timeout=120)[0] for name, g in gens.items()}
        assert {name: o.new_token_ids for name, o in outs.items()} == want, warm
        assert enc.encodes == before + (0 if warm else 2)  # the base rows (shared with "lora") and the projector's
        if warm:  # each from its own prefix-cache chain, image span included
            assert all(o.num_cached_tokens > 0 for o in outs.values())
    spans = {name: llm.embed(prompt, name).embeds for name in want}
    keys = {name: {s.key for s in v} for name, v in spans.items()}
    assert keys["lora"] == keys[None] and not keys["proj"] & keys[None]
    assert not np.array_equal(spans["proj"][0].rows, spans[None][0].rows)
    np.testing.assert_array_equal(spans["lora"][0].rows, spans[None][0].rows)
    # a prompt embedded for the base model and submitted for the adapter is embedded again, for it
    base_embedded = llm.embed(prompt)
    assert llm.generate(base_embedded, GREEDY, adapter="proj")[0].new_token_ids == want["proj"]


def test_tower_calls_take_one_projector_at_a_time(case, served):
    """The first tower call held while six requests queue their images (base, adapter, base, ...):
    each later call encodes one projector's images, and every request gets its projector's rows."""
    from surogate.serve.multimodal import BASE, ImageEncoder

    model = served.model
    slot = served.adapters["proj"]
    gate, calls = threading.Event(), []

    def encode(px, *args, projector=None):
        calls.append(BASE if projector is None else projector)
        if len(calls) == 1:
            gate.wait(30)
        return model.encode_images(px, *args, projector=projector)

    enc = ImageEncoder(served.images.prompt, encode, has_projector=model.projectors.__contains__)
    jobs = [(pic(30), BASE)] + [(pic(31 + i), slot if i % 2 == 0 else BASE) for i in range(6)]
    out: dict[int, np.ndarray] = {}

    def request(i):
        img, adapter = jobs[i]
        out[i] = enc.rows([img], adapter=adapter)[0]

    threads = [threading.Thread(target=request, args=(0,))]
    threads[0].start()
    while not calls:
        time.sleep(0.01)
    threads += [threading.Thread(target=request, args=(i,)) for i in range(1, len(jobs))]
    for t in threads[1:]:
        t.start()
    while len(enc._queue) < len(jobs) - 1:
        time.sleep(0.01)
    gate.set()
    for t in threads:
        t.join(60)
    assert calls[0] == BASE and sorted(calls[1:]) == sorted([BASE, slot]) and enc.encodes == len(jobs)
    for i, (img, adapter) in enumerate(jobs):
        want = served.images.encode_batch([img], adapter=adapter)[0]
        np.testing.assert_allclose(out[i], want, atol=1e-4, rtol=1e-5)  # (batched: other shapes)


def test_unloading_drops_the_projector_and_its_rows(case, served):
    from surogate.models.peft import load_peft_adapter

    client, enc, model = served.client, served.images, served.model
    llm = served.llm()
    messages = user("Again", pic(40))
    assert client.load_adapter("again", *load_peft_adapter(case.adapter)) == []
    slot = client.adapters["again"]
    assert slot in model.projectors
    assert answer(llm, messages, "again") == case.reference(case.adapter)(messages)
    assert any(k[0] == slot for k in enc._cache)
    client.release()  # asleep and awake: the projector's device twins go and come back with the model's
    client.restore()
    again = user("Again", pic(41))
    assert answer(llm, again, "again") == case.reference(case.adapter)(again)
    client.unload_adapter("again")
    assert slot not in model.projectors and not any(k[0] == slot for k in enc._cache)
    assert slot not in served.runner.adapters


def test_a_projector_that_does_not_fit_is_refused_naming_the_tensor(case, served, tmp_path):
    from safetensors.numpy import load_file, save_file

    from surogate.models.peft import load_peft_adapter

    tensors = load_file(case.adapter / "adapter_model.safetensors")
    name = next(k for k in tensors if "multi_modal_projector.mm_input_projection_weight" in k or
                "visual.merger.linear_fc2.weight" in k)

    def edited(what, change):
        folder = tmp_path / what
        shutil.copytree(case.adapter, folder)
        save_file(change(dict(tensors)), folder / "adapter_model.safetensors", metadata={"format": "pt"})
        return folder

    wide = edited("shape", lambda t: {**t, name: np.zeros((t[name].shape[0], t[name].shape[1] + 1), np.float32)})
    extra = ("base_model.model.model.visual.deepstack_merger_list.7.linear_fc2.weight" if "visual" in name else
             "base_model.model.model.multi_modal_projector.mm_extra_weight")
    unknown = edited("unknown", lambda t: {**t, extra: t[name]})
    hf = name[len("base_model.model."):]
    before = dict(served.client.adapters)
    with pytest.raises(InvalidArgumentError, match=rf"{hf}.*has shape \[\d+, \d+\], this model's is"):
        served.client.load_adapter("wide", *load_peft_adapter(wide))
    with pytest.raises(InvalidArgumentError, match=rf"{extra[len('base_model.model.'):]} is none of this model's"):
        served.client.load_adapter("unknown", *load_peft_adapter(unknown))
    assert served.client.adapters == before and len(served.model.projectors) == 1  # "proj"'s alone
