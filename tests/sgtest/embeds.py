"""Serving with embedding rows (EmbedSpan) from tests: prompts with placeholder ids, the engine's
greedy tokens and logprobs, and transformers' answers for the same rows (generate with
inputs_embeds; a Gemma 3 forward under the bidirectional span mask its multimodal model builds)."""

from __future__ import annotations

import numpy as np

from surogate.serve.engine_client import EngineClient
from surogate.serve.model_runner import ProgramRunner
from surogate.serve.types import EmbedSpan, EngineConfig, SamplingParams

PLACEHOLDER = 5  # the id standing for an image token in the tests' prompts


def prompt(n: int, seed: int, vocab: int) -> list[int]:
    return np.random.default_rng(seed).integers(10, vocab, n).tolist()


def with_placeholders(ids: list[int], spans: list[tuple[int, int]]) -> list[int]:
    ids = list(ids)
    for start, n in spans:
        ids[start:start + n] = [PLACEHOLDER] * n
    return ids


def greedy(client: EngineClient, ids: list[int], n: int, embeds=()) -> tuple[list[int], int]:
    """Greedy tokens and the prompt tokens the prefix cache served."""
    rid = client.submit(ids, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), embeds=embeds)
    outs = client.wait(rid, timeout=120)
    return [t for o in outs for t in o.new_token_ids], outs[-1].num_cached_tokens


def hf_greedy_embeds(ref, ids: list[int], spans: list[EmbedSpan], n: int) -> list[int]:
    import torch

    with torch.no_grad():
        e = ref.get_input_embeddings()(torch.tensor([ids]))[0].clone()
        for s in spans:
            e[s.start:s.start + len(s.rows)] = torch.from_numpy(s.rows)
        out = ref.generate(inputs_embeds=e[None], attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, -n:].tolist()



def hf_logits(ref, ids: list[int], spans: list[EmbedSpan], bidirectional: bool = True) -> np.ndarray:
    """transformers' Gemma 3 (text) on the prompt's embeddings with the spans' rows, under the
    masks its multimodal model builds from token_type_ids (create_masks_for_vision_model: full
    layers OR(causal, same image), sliding ones AND(window, OR(causal, same image))); the spans
    marked as images when ``bidirectional`` (adjacent spans would merge into one image there)."""
    import inspect

    import torch
    from transformers.models.gemma3 import modeling_gemma3

    create_masks_for_vision_model = modeling_gemma3.create_masks_for_vision_model
    get_block_sequence_ids_for_mask = getattr(modeling_gemma3, "get_block_sequence_ids_for_mask", None)

    L = len(ids)
    token_type_ids = torch.zeros(1, L, dtype=torch.long)
    for s in spans:
        if bidirectional and s.bidirectional:
            token_type_ids[0, s.start:s.start + len(s.rows)] = 1
    with torch.no_grad():
        e = ref.get_input_embeddings()(torch.tensor([ids]))[0].clone()
        for s in spans:
            e[s.start:s.start + len(s.rows)] = torch.from_numpy(s.rows)
        positions = torch.arange(L)[None]
        # the cache argument is `cache` in transformers 5.2x, `past_key_values` before
        params = inspect.signature(create_masks_for_vision_model).parameters
        cache_kw = "cache" if "cache" in params else "past_key_values"
        blocks = ({"block_sequence_ids": get_block_sequence_ids_for_mask(token_type_ids)}
                  if "block_sequence_ids" in params else {"token_type_ids": token_type_ids})
        masks = create_masks_for_vision_model(config=ref.config, inputs_embeds=e[None],
                                              attention_mask=torch.ones(1, L, dtype=torch.long), **{cache_kw: None},
                                              position_ids=positions, **blocks)
        out = ref(inputs_embeds=e[None], position_ids=positions, attention_mask=masks)
    return out.logits[0].float().numpy()


class Recording:
    """A ProgramRunner seen through the Python runner interface, keeping each step's positions,
    kv_limit and embedding rows' token rows (every row's logits are asked for: logprobs)."""

    def __init__(self, runner: ProgramRunner):
        self.runner, self.steps = runner, []
        self.vocab_size, self.hidden_size = runner.vocab_size, runner.model.spec.hidden_size

    def run(self, step):
        self.steps.append((step.positions.copy(), step.kv_limit.copy(), step.embed_index.copy()))
        return self.runner.run(step)[0]


def served_logprobs(ours, ids, spans, **kw):
    """(prompt logprobs of each next prompt token, the first answer token's top-5) served, and the
    runner's steps."""
    config = EngineConfig(num_blocks=32, **kw)
    rec = Recording(ProgramRunner(ours, num_blocks=32, block_size=config.block_size))
    with EngineClient(rec, config) as client:
        rid = client.submit(ids, SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, logprobs=5),
                            embeds=spans)
        out = client.wait(rid, timeout=120)[0]
    prompt_lps = np.array([lp.logprob for lp in out.prompt_logprobs[1:]])
    top = [(t.token_id, t.logprob) for t in out.logprobs[0].top]
    return prompt_lps, top, rec.steps


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))
