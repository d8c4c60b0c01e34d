"""LoRA adapters per request: one engine serves the base model and a PEFT adapter at once.
Greedy tokens of adapter requests equal HF transformers + peft with that adapter, those of base
requests equal transformers alone, mixed in one batch (the runner splits the step per adapter)
and with the prefix cache warm (each adapter keeps its own cached blocks). Adapters loaded and
unloaded at run time (EngineClient.load_adapter / unload_adapter: new slots, least recently used
evicted past max_loras, running requests finish). Then `surogate serve --lora NAME=PATH` and
`POST /v1/load_lora_adapter` / `/v1/unload_lora_adapter`, asked with model=NAME through the openai
SDK, and the 400s of adapters that are missing, corrupt or made for another model."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import surogate  # noqa: E402
from sgtest.engine import hf_greedy  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402
from surogate.errors import InvalidArgumentError, NotFoundError  # noqa: E402
from surogate.serve.engine_client import EngineClient  # noqa: E402
from surogate.serve.model_runner import ProgramRunner  # noqa: E402
from surogate.serve.types import EngineConfig, SamplingParams  # noqa: E402
from surogate.train.lora import ALL_TARGETS, init_lora, load_peft_adapter, save_peft_adapter  # noqa: E402

N_NEW = 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = make_qwen3(root / "base", seed=21, initializer_range=0.2)
    model = surogate.load_model(base)
    cfg = LoRAConfig(rank=8, alpha=16.0, targets=ALL_TARGETS)
    g = model.arch.build(mode="logits", dtype="float32", lora=cfg)
    rng = np.random.default_rng(5)
    params = {k: (v if k.endswith("lora_A") else rng.standard_normal(v.shape).astype(np.float32) * 0.3)
              for k, v in init_lora(g, 7).items()}  # B != 0: the adapter changes the answers
    adapter = save_peft_adapter(root / "adapter", params, cfg, base_model=str(base))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
    tuned = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32), str(adapter)).eval()
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 400, n).tolist() for n in (5, 19, 33, 40)]  # ids the tokenizer knows
    want = {"base": [hf_greedy(ref, p, N_NEW) for p in prompts],
            "lora": [hf_greedy(tuned, p, N_NEW) for p in prompts]}
    assert want["base"] != want["lora"]  # the adapter matters
    return model, adapter, prompts, want


@pytest.fixture(scope="module")
def second(setup, tmp_path_factory):
    """Another adapter (other rank and targets) and its peft greedy answers."""
    model, _, prompts, want = setup
    cfg = LoRAConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj"))
    g = model.arch.build(mode="logits", dtype="float32", lora=cfg)
    rng = np.random.default_rng(8)
    params = {k: (v if k.endswith("lora_A") else rng.standard_normal(v.shape).astype(np.float32) * 0.5)
              for k, v in init_lora(g, 8).items()}
    adapter = save_peft_adapter(tmp_path_factory.mktemp("lora2") / "adapter", params, cfg, base_model=str(model.path))
    tuned = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(str(model.path), dtype=torch.float32), str(adapter)).eval()
    answers = [hf_greedy(tuned, p, N_NEW) for p in prompts]
    assert answers not in (want["base"], want["lora"])
    return adapter, answers


def run(client, jobs: list[tuple[list[int], int | None]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=N_NEW, ignore_eos=True)
    ids = [client.submit(p, params, adapter) for p, adapter in jobs]
    return [[t for out in client.wait(i, timeout=120) for t in out.new_token_ids] for i in ids]


@pytest.mark.parametrize("fuse_qkv", [False, True])
def test_base_and_adapter_requests_in_one_batch_match_transformers_and_peft(setup, fuse_qkv):
    model, adapter, prompts, want = setup
    runner = ProgramRunner(model, num_blocks=64, block_size=16, fuse_qkv=fuse_qkv)
    runner.add_adapter(0, *load_peft_adapter(adapter))
    with EngineClient(runner, EngineConfig(num_blocks=64, block_size=16)) as client:
        jobs = [(p, None) for p in prompts] + [(p, 0) for p in prompts]
        got = run(client, jobs)  # all at once: the steps mix the base model and the adapter
        assert got == want["base"] + want["lora"]
        hits = client.stats().prefix_cache_hits
        again = run(client, list(reversed(jobs)))  # warm: each adapter reads only its own blocks
        assert again == list(reversed(want["base"] + want["lora"]))
        assert client.stats().prefix_cache_hits > hits


def test_seeded_sampled_requests_of_the_base_and_an_adapter_draw_in_one_batch_as_alone(setup):
    """A step of both runs as one sub-step per adapter, each row with its own sample_params: the
    draws on the device do not depend on the split."""
    model, adapter, prompts, _ = setup
    runner = ProgramRunner(model, num_blocks=64, block_size=16)
    runner.add_adapter(0, *load_peft_adapter(adapter))

    def sampled(client, jobs):
        ids = [client.submit(p, SamplingParams(seed=7 + k, temperature=0.9, top_p=0.95, max_tokens=N_NEW,
                                               ignore_eos=True, logprobs=0), a) for k, (p, a) in jobs]
        outs = [client.wait(i, timeout=120) for i in ids]
        return [([t for o in out for t in o.new_token_ids], [lp.logprob for o in out for lp in o.logprobs])
                for out in outs]

    jobs = list(enumerate([(p, None) for p in prompts] + [(p, 0) for p in prompts]))
    with EngineClient(runner, EngineConfig(num_blocks=64, block_size=16)) as client:
        together = sampled(client, jobs)
        alone = [sampled(client, [job])[0] for job in jobs]
    assert [t for t, _ in together] == [t for t, _ in alone]
    for (_, a), (_, b) in zip(together, alone):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert [t for t, _ in together[:4]] != [t for t, _ in together[4:]]  # the adapter matters


def test_an_adapter_for_another_model_is_refused(setup):
    model, adapter, _, _ = setup
    cfg, params = load_peft_adapter(adapter)
    params = {k: v[:, :-1] if k.endswith("lora_A") else v for k, v in params.items()}
    with pytest.raises(InvalidArgumentError, match="another base model"):
        ProgramRunner(model, num_blocks=8).add_adapter(0, cfg, params)


def test_surogate_serve_lora_answers_with_the_adapter(setup):
    openai = pytest.importorskip("openai")
    from sgtest.server import surogate_serve

    model, adapter, prompts, want = setup
    with surogate_serve(f"tiny={model.path}", "--lora", f"tuned={adapter}") as base_url:
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none")
        assert {m.id for m in client.models.list().data} >= {"tiny", "tuned"}
        for name, key in (("tuned", "lora"), ("tiny", "base")):
            r = client.completions.create(model=name, prompt=prompts[2], max_tokens=N_NEW, temperature=0,
                                          extra_body={"ignore_eos": True})
            text = model.tokenizer.decode(want[key][2])
            assert r.choices[0].text == text, (name, r.choices[0].text, text)


def test_adapters_load_and_unload_at_run_time_with_lru_eviction(setup, second):
    model, adapter, prompts, want = setup
    adapter2, want2 = second
    runner = ProgramRunner(model, num_blocks=64, block_size=16)
    with EngineClient(runner, EngineConfig(num_blocks=64, block_size=16), max_loras=2) as client:
        assert client.load_adapter("a", *load_peft_adapter(adapter)) == []
        assert client.load_adapter("b", *load_peft_adapter(adapter2)) == []
        jobs = [(p, "a") for p in prompts] + [(p, "b") for p in prompts] + [(p, None) for p in prompts]
        assert run(client, jobs) == want["lora"] + want2 + want["base"]
        with pytest.raises(InvalidArgumentError, match="already been loaded"):
            client.load_adapter("a", *load_peft_adapter(adapter))
        run(client, [(prompts[0], "a")])  # "b" is now the least recently used
        assert client.load_adapter("c", *load_peft_adapter(adapter2)) == ["b"]
        assert sorted(client.adapters) == ["a", "c"] and len(runner.adapters) == 2
        with pytest.raises(NotFoundError, match="'b'"):
            client.submit(prompts[0], SamplingParams(max_tokens=1), "b")
        # a new slot for "c": the prefix cache never serves it b's blocks of the same prompt
        assert run(client, [(p, "c") for p in prompts]) == want2

        # Unloaded while a request runs: that request finishes, new ones are refused, then the slot goes.
        params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)  # long: still running below
        slot = client.adapters["a"]
        running = client.submit(prompts[3], params, "a")
        client.unload_adapter("a")
        assert slot in runner.adapters  # kept while its request runs
        with pytest.raises(NotFoundError):
            client.submit(prompts[3], params, "a")
        tokens = [t for out in client.wait(running, timeout=120) for t in out.new_token_ids]
        assert len(tokens) == 128 and tokens[:N_NEW] == want["lora"][3]  # greedy: the same first tokens
        assert list(client.adapters) == ["c"] and list(runner.adapters) == [client.adapters["c"]]
        with pytest.raises(NotFoundError, match="cannot be found"):
            client.unload_adapter("a")
        assert client.load_adapter("a", *load_peft_adapter(adapter)) == []  # loaded again, in a new slot
        assert run(client, [(p, "a") for p in prompts]) == want["lora"]


def _bad_adapters(root, adapter, model) -> dict[str, tuple[str, str]]:
    """name -> (folder, what the 400 says)."""
    def copy(name):
        dst = root / name
        shutil.copytree(adapter, dst)
        return dst

    def edit_config(folder, **changes):
        c = json.loads((folder / "adapter_config.json").read_text())
        c.update(changes)
        (folder / "adapter_config.json").write_text(json.dumps(c))
        return folder

    corrupt = copy("corrupt")
    (corrupt / "adapter_config.json").write_text("{not json")
    truncated = copy("truncated")
    (truncated / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    cfg, params = load_peft_adapter(adapter)
    other = save_peft_adapter(root / "other-base", {k: v[:, :-1] if k.endswith("lora_A") else v
                                                    for k, v in params.items()}, cfg, base_model="other")
    return {"missing": (str(root / "nowhere"), "no adapter_config.json"),
            "corrupt": (str(corrupt), "not valid JSON"),
            "truncated": (str(truncated), "adapter_model.safetensors"),
            "rank": (str(edit_config(copy("rank"), r=4, lora_alpha=8)), "the model needs"),
            "targets": (str(edit_config(copy("targets"), target_modules=["q_proj"])), "unexpected"),
            "base": (str(other), "another base model")}


def test_surogate_serve_loads_and_unloads_adapters_at_run_time(setup, second, tmp_path):
    openai = pytest.importorskip("openai")
    httpx = pytest.importorskip("httpx")
    from sgtest.server import surogate_serve

    model, adapter, prompts, want = setup
    adapter2, want2 = second
    bad = _bad_adapters(tmp_path, adapter, model)
    with surogate_serve(f"tiny={model.path}", "--lora", f"tuned={adapter}", "--max-loras", "2",
                        "--kv-cache-tokens", "2048") as base_url:
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0)
        http = httpx.Client(base_url=base_url, timeout=60)

        def answer(name, i=2):
            r = client.completions.create(model=name, prompt=prompts[i], max_tokens=N_NEW, temperature=0,
                                          extra_body={"ignore_eos": True})
            return r.choices[0].text

        r = http.post("/v1/load_lora_adapter", json={"lora_name": "second", "lora_path": str(adapter2)})
        assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'second' added successfully.")
        models = {m.id: m for m in client.models.list().data}
        assert set(models) == {"tiny", "tuned", "second"} and models["second"].model_extra["parent"] == "tiny"
        for name, expected in (("second", want2[2]), ("tuned", want["lora"][2]), ("tiny", want["base"][2])):
            assert answer(name) == model.tokenizer.decode(expected), name

        r = http.post("/v1/load_lora_adapter", json={"lora_name": "second", "lora_path": str(adapter2)})
        assert r.status_code == 400 and "already been loaded" in r.json()["error"]["message"]
        for what, (folder, says) in bad.items():
            r = http.post("/v1/load_lora_adapter", json={"lora_name": f"bad-{what}", "lora_path": folder})
            assert r.status_code == 400, (what, r.text)
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error" and err["param"] == "lora_path", (what, err)
            assert says in err["message"], (what, err["message"])
        assert {m.id for m in client.models.list().data} == {"tiny", "tuned", "second"}

        # --max-loras 2: a third evicts the least recently used ("second": "tuned" answered after it)
        r = http.post("/v1/load_lora_adapter?model=tiny", json={"lora_name": "third", "lora_path": str(adapter)})
        assert r.status_code == 200, r.text
        assert {m.id for m in client.models.list().data} == {"tiny", "tuned", "third"}
        assert answer("third", 1) == model.tokenizer.decode(want["lora"][1])

        r = http.post("/v1/unload_lora_adapter", json={"lora_name": "tuned"})
        assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'tuned' removed successfully.")
        with pytest.raises(openai.NotFoundError):
            answer("tuned")
        r = http.post("/v1/unload_lora_adapter", json={"lora_name": "tuned"})
        assert r.status_code == 404 and "cannot be found" in r.json()["error"]["message"]
        assert [m.id for m in client.models.list().data] == ["tiny", "third"]
