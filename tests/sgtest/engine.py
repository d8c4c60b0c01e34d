"""Drive the serving engine from tests: random prompts, an engine over a model's Programs, greedy
generation through it, and transformers' greedy generation to compare with."""

from __future__ import annotations

import numpy as np

from surogate.serve.engine_client import EngineClient
from surogate.serve.model_runner import ProgramRunner
from surogate.serve.types import EngineConfig, SamplingParams


def prompts(vocab: int, n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, int(rng.integers(1, 40))).tolist() for _ in range(n)]


def engine(model, num_blocks: int = 64, block_size: int = 16, fuse_qkv: bool | None = None, **kw) -> EngineClient:
    config = EngineConfig(num_blocks=num_blocks, block_size=block_size, **kw)
    runner = ProgramRunner(model, num_blocks=num_blocks, block_size=block_size, fuse_qkv=fuse_qkv,
                           max_num_seqs=config.max_num_seqs)
    return EngineClient(runner, config)


def draft_engine(target, draft, num_blocks: int = 64, block_size: int = 16, k: int = 4, **kw) -> EngineClient:
    """An engine over ``target`` drafting with ``draft`` (speculative_method "draft", k tokens)."""
    config = EngineConfig(num_blocks=num_blocks, block_size=block_size, speculative_method="draft",
                          num_speculative_tokens=k, **kw)
    return EngineClient(ProgramRunner(target, num_blocks, block_size, max_num_seqs=config.max_num_seqs), config,
                        draft=ProgramRunner(draft, num_blocks, block_size, max_num_seqs=config.max_num_seqs))


def generate(client: EngineClient, ps: list[list[int]], n: int) -> list[list[int]]:
    """Greedy, ignore_eos, all submitted at once; the tokens of each, in order."""
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    ids = [client.submit(p, params) for p in ps]
    return [[t for out in client.wait(i, timeout=120) for t in out.new_token_ids] for i in ids]


def hf_greedy(ref, prompt: list[int], n: int) -> list[int]:
    import torch

    with torch.no_grad():
        ids = torch.tensor([prompt])
        # an explicit mask: generate would take pad_token_id (0) in the prompt for padding
        out = ref.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                           min_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()
