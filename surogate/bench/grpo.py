"""`surogate bench grpo`: a GRPO step on a named shape (random weights), co-located against a
separate engine copy, in the same run.

Both modes run the same `GRPOTrainer` steps: P prompts of ``prompt_len`` random tokens, G
completions each of up to ``completion_len`` tokens (a random model rarely ends one early),
a length reward, LoRA on every projection. **co-located** is `surogate grpo` as it ships: the
engine's Programs read the trainer's weights and LoRA arrays. **separate copy** is the usual
layout of a trainer beside an inference engine (TRL + vLLM colocate, OpenRLHF): the engine
serves its own copy of the weights (and fused q/k/v, as `surogate serve` does) and the adapter is
copied to it before every rollout. Reported per mode: rollout tokens/s, step time (rollout +
the update), the rollout share, and our allocator's peak GPU memory; then the ratios; then the
serving engine's rollout tok/s on the same prompts and sampling (an engine as `surogate serve`
builds it, nothing trained), the ceiling the co-located rollouts aim at. The
tokenizer is a word-level stand-in (``t0`` .. ``tV-1``) so text rewards see the sampled ids.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from surogate.bench.train import random_model
from surogate.model import Model
from surogate.train.grpo import ADAPTER_SLOT, BLOCK_SIZE, GRPOTrainer

GiB = 2**30


def word_tokenizer(vocab_size: int):
    """Token i is the word ``t{i}``: every id decodes, and a prompt of words encodes to those ids."""
    import tokenizers

    from surogate.io import Tokenizer

    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"t{i}": i for i in range(vocab_size)},
                                                               unk_token="t0"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return Tokenizer(backend, {"eos_token": "t0"})


class SeparateCopyGRPOTrainer(GRPOTrainer):
    """The peer layout: the engine over a copy of the weights, the adapter copied before each rollout."""

    def _start_engine(self) -> None:
        m = self.model
        copy = Model(m.spec, m.family, {n: a.copy() for n, a in m.params.items()}, dtype=m.dtype, device=m.device,
                     config=m.config, tokenizer=m.tokenizer)
        shared, self.model = self.model, copy
        try:
            lora, self.lora = self.lora, None  # the base engine; the adapter is added below
            super()._start_engine()
        finally:
            self.model, self.lora = shared, lora  # (the runner fused q/k/v by copying: the copy's own arrays)
        if self.lora is not None:
            self.adapter = ADAPTER_SLOT

    def rollout(self, samples, step, index=None):
        if self.lora is not None:  # the weight sync: the trained adapter to the engine's copy
            t0 = time.perf_counter()
            host = {n: self.exe.pull(n).copy() for n in self.trainable}
            self.runner.add_adapter(ADAPTER_SLOT, dataclasses.replace(self.lora, dropout=0.0), host)
            self.sync_seconds = time.perf_counter() - t0
        return super().rollout(samples, step, index)


def run(shape: str, *, prompts: int, generations: int, prompt_len: int, completion_len: int, dtype: str,
        device: str, steps: int, warmup: int, lora_rank: int) -> None:
    from surogate import _native
    from surogate.config import load_config
    from surogate.model import resolve_device

    device = resolve_device(device)
    if lora_rank <= 0:
        raise SystemExit("surogate bench grpo: --lora-rank must be positive (the separate-copy peer syncs an adapter)")
    rows = []
    for name, cls in (("co-located", GRPOTrainer), ("separate copy", SeparateCopyGRPOTrainer)):
        with tempfile.TemporaryDirectory(prefix="surogate-bench-grpo-") as tmp:
            model = random_model(shape, dtype, device=device)
            model.tokenizer = word_tokenizer(model.spec.vocab_size)
            rng = np.random.default_rng(0)
            data = Path(tmp) / "prompts.jsonl"
            vocab = model.spec.vocab_size
            lines = [json.dumps({"prompt": " ".join(f"t{i}" for i in rng.integers(1, vocab, prompt_len))})
                     for _ in range(prompts * (steps + warmup))]
            data.write_text("\n".join(lines) + "\n")
            cfg = load_config({"model": f"random:{shape}", "output_dir": tmp, "device": device,
                               "recipe": "fp32" if dtype == "float32" else "bf16",
                               "datasets": [{"path": str(data), "type": "prompt"}], "reward_functions": ["length"],
                               "num_generations": generations, "max_prompt_length": prompt_len,
                               "max_completion_length": completion_len, "per_device_train_batch_size": prompts,
                               "gradient_accumulation_steps": 1, "max_steps": steps + warmup, "save_steps": 0,
                               "lora_rank": lora_rank, "lora_alpha": 2 * lora_rank, "beta": 0.04,
                               "lr_scheduler_type": "constant", "learning_rate": 1e-5}, kind="grpo")
            base = 0
            if device != "cpu":  # the peak of this mode alone (whatever the last one left allocated)
                _native.reset_peak_stats(device)
                base = _native.allocator_stats(device)["allocated_bytes"]  # the weights upload as Programs bind
            tr = cls(cfg, model=model)
            tr.train()
            steps_ = [r for r in map(json.loads, open(Path(tmp) / "metrics.jsonl")) if r["type"] == "step"][warmup:]
            peak = _native.allocator_stats(device)["peak_allocated_bytes"] - base if device != "cpu" else 0
            weights = sum(a.nbytes for a in model.params.values())
            rows.append((name, float(np.mean([s["rollout_tokens_per_second"] for s in steps_])),
                         float(np.mean([s["step_time"] for s in steps_])),
                         float(np.mean([s["rollout_time"] / s["step_time"] for s in steps_])), peak, weights,
                         tr.runner.kv_bytes))
            del tr, model
            if device != "cpu":
                _native.empty_cache(device)
    print(f"GRPO step, {shape} ({dtype}, {device}): {prompts} prompts x {generations} completions, prompt "
          f"{prompt_len} + completion {completion_len} tokens, LoRA r{lora_rank}, KV cache {BLOCK_SIZE}-token "
          f"blocks; mean of {steps} steps after {warmup}")
    print(f"{'mode':<15} {'rollout tok/s':>14} {'step s':>8} {'rollout %':>10} {'peak GiB':>9} {'weights GiB':>12} "
          f"{'KV GiB':>7}")
    for name, tps, st, share, peak, w, kv in rows:
        print(f"{name:<15} {tps:>14,.0f} {st:>8.3f} {share * 100:>9.0f}% {peak / GiB:>9.2f} {w / GiB:>12.2f} "
              f"{kv / GiB:>7.2f}")
    (a, b) = rows
    print(f"co-located / separate: rollout tok/s x{a[1] / b[1]:.2f}, step time x{a[2] / b[2]:.2f}"
          + (f", peak memory x{a[4] / b[4]:.2f} ({(b[4] - a[4]) / GiB:+.2f} GiB for the copy)" if b[4] else ""))
    serving = serving_rollout(shape, dtype, device, prompts, generations, prompt_len, completion_len, steps, warmup)
    print(f"serving engine (`surogate serve`'s runner: its own weights, fused q/k/v, no adapter), the same "
          f"prompts and sampling (temperature 1, logprobs): {serving:,.0f} rollout tok/s; co-located / serving "
          f"x{a[1] / serving:.2f}")


def serving_rollout(shape: str, dtype: str, device: str, prompts: int, generations: int, prompt_len: int,
                    completion_len: int, steps: int, warmup: int) -> float:
    """Rollouts of the GRPO runs' kind (random prompts of the same length, the same counts and
    sampling, other seeds) through an engine built as `surogate serve` builds one (launch's ProgramRunner and
    EngineConfig defaults, fused q/k/v on a GPU), all of a step's requests submitted at once:
    completion tokens / s, the mean over the timed steps after ``warmup`` untimed ones."""
    from surogate.serve.engine_client import EngineClient
    from surogate.serve.llm import LLM
    from surogate.serve.model_runner import ProgramRunner
    from surogate.serve.types import EngineConfig, SamplingParams

    model = random_model(shape, dtype, device=device)
    rng = np.random.default_rng(0)
    vocab = model.spec.vocab_size
    rows = [rng.integers(1, vocab, prompt_len).tolist() for _ in range(prompts * (steps + warmup))]
    seqs = prompts * generations
    ctx = prompt_len + completion_len
    num_blocks = seqs * -(-ctx // BLOCK_SIZE) + 1
    runner = ProgramRunner(model, num_blocks, BLOCK_SIZE, max_num_seqs=seqs)
    rates = []
    with EngineClient(runner, EngineConfig(num_blocks=num_blocks, block_size=BLOCK_SIZE, max_num_seqs=seqs,
                                           max_num_batched_tokens=max(2048, min(8192, seqs * 16)),
                                           max_model_len=ctx, eos_token_ids=[0], seed=0)) as client:
        llm = LLM(client, None)
        for step in range(steps + warmup):
            batch = rows[step * prompts:(step + 1) * prompts]
            params = [SamplingParams(n=generations, temperature=1.0, max_tokens=completion_len, logprobs=0,
                                     detokenize=False, seed=1000 * step + i) for i in range(len(batch))]
            client.reset_prefix_cache()
            t0 = time.perf_counter()
            with client.held():
                gen = llm.submit(batch, params)
            with gen:
                outs = gen.result()
            if step >= warmup:
                rates.append(sum(len(o.new_token_ids) for o in outs) / (time.perf_counter() - t0))
    runner.close()
    return float(np.mean(rates))
