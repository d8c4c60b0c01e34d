"""LoRA adapters per request: one engine serves the base model and a PEFT adapter at once.
Greedy tokens of adapter requests equal HF transformers + peft with that adapter, those of base
requests equal transformers alone, mixed in one batch (the runner splits the step per adapter)
and with the prefix cache warm (each adapter keeps its own cached blocks). Then `surogate serve
--lora NAME=PATH`, asked with model=NAME through the openai SDK."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import surogate  # noqa: E402
from sgtest.engine import hf_greedy  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402
from surogate.errors import InvalidArgumentError  # noqa: E402
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
