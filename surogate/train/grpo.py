"""`surogate grpo`: the SFT trainer's loop, checkpoints and outputs, with rollouts and GRPO's loss.

One optimizer step (``gradient_accumulation_steps`` micro-batches of B prompts each):

1. **Rollouts**: every prompt of the step goes to the serving engine at once through the
   generation API (``LLM.submit``), ``num_generations`` answers each, token ids and the sampled
   tokens' log-probs back (``SamplingParams.logprobs = 0``). The engine runs in this process over
   the trainer's weights: its Programs bind the model's weight arrays (on a GPU the one device
   copy, ``Model.device_param``), and the adapter slot the rollouts use is bound to the trainer's
   own LoRA arrays (``ProgramRunner.bind_adapter``: no copy; the optimizer updates them in place,
   so each step samples from the current policy). Full fine-tuning works the same way: the
   optimizer updates the weight arrays the engine reads. The prefix cache is reset before each
   step's rollouts (cached K / V came from the previous weights), and the step's requests are
   all submitted while the engine is held (``EngineClient.held``), so its first step sees them
   all. Q / K / V run as one fused projection as in serving, over the model's own stack
   (``Model.stack_qkv``: the trainer's q, k and v parameters are views of it), not a copy.
2. **Rewards** (`grpo_env`): each function of ``reward_functions`` per completion, weighted and
   summed; advantages normalised per group (`grpo_loss.group_advantages`).
3. **Loss**: per micro-batch, its B x G completions are the documents of one flat row (prompt +
   completion, targets on the completion tokens); the reference (the base, adapter off; for full
   fine-tuning a frozen copy; none when beta is 0) runs its forward, then the policy its
   ``forward`` phase: the per-token losses are -logp of each sampled token, recomputed by the
   trainer. `grpo_loss.grpo_token_loss` gives the loss and d loss / d logp against the sampler's
   log-probs (the importance ratio), written into the loss seed ``dloss`` (= -d loss / d logp),
   and the policy runs its ``backward`` phase. Then the SFT optimizer phase.

The trainer's log-probs are over logits / ``temperature`` (TRL's), the reference's too. The
ratio's denominator is fixed by the step's first pass: at temperature 1 the sampler's own
log-probs (the engine reports the raw distribution, the one the trainer computes: the ratio is
1 up to numerics on policy), otherwise the trainer's first-pass log-probs (TRL's
old_per_token_logps). With ``num_iterations`` > 1 the step makes that many optimizer updates over
its one batch of rollouts, the later passes' ratios moving off 1 (clipped). Rollout seeds are a
function of (seed, step, prompt), so a resumed run samples what the uninterrupted one sampled.

Data parallel (``gpus: R``, or Ray ranks in processes; data_parallel.py): each rank holds its
own engine over its own weights and samples its share of the step's prompts, B of each global
micro-batch of B * R, with the seeds one rank would give them (their place in the step). The
rewards, lengths and truncations of every rank come back, so the advantages (``scale_rewards:
batch`` included), the loss weights (the step's completions and tokens) and the metrics are the
one-rank run's; then every rank learns on its own groups, the gradients summed. A full
fine-tune's replica ranks (threads of this process) train copies of the weights while their
engines read the model's arrays, rank 0's: the ranks' weights are bit-identical after every
update (plain DP and ZeRO alike), so that is the same policy, without another stacked copy.

Step lines carry TRL's metric names: ``reward``, ``reward_std``, ``rewards/<fn>/mean`` and
``/std``, ``kl``, ``clip_ratio/low_mean`` / ``high_mean`` / ``region_mean``,
``completions/mean_length`` / ``min_length`` / ``max_length`` / ``clipped_ratio``,
``frac_reward_zero_std``, ``sampling/sampling_logp_difference/mean`` / ``max``; ours:
``rollout_tokens_per_second``, ``rollout_time``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass

import numpy as np

from surogate.config.grpo import GRPOConfig
from surogate.errors import ConfigError
from surogate.train.data.packing import Batch
from surogate.train.data.prompts import PromptSample, build_prompt_dataset
from surogate.train.data_parallel import by_rank, in_step_order
from surogate.train.grpo_env import call_reward, load_reward_functions
from surogate.train.grpo_loss import group_advantages, grpo_token_loss, token_weights
from surogate.train.trainer import Trainer

ADAPTER_SLOT = 0  # the engine slot bound to the trainer's LoRA arrays
BLOCK_SIZE = 16


@dataclass
class Rollout:
    """One completion: its prompt's sample, the sampled ids and the sampler's log-prob of each."""

    sample: PromptSample
    ids: list[int]
    logps: np.ndarray  # float64 [len(ids)]
    text: str
    truncated: bool  # stopped by max_completion_length, not by an end token
    advantage: float = 0.0
    old: np.ndarray | None = None  # the behaviour policy's log-probs of ids, the ratio's denominator (learn sets it)


class GRPOTrainer(Trainer):
    SHARD_GRADS = False  # (a rank without prompts runs no backward: its accumulators stay whole)
    cfg: GRPOConfig

    def __init__(self, cfg: GRPOConfig, model=None, stream=None, dist=None):
        self.rewards = load_reward_functions(list(cfg.reward_functions))  # bad paths fail before any loading
        self.reward_weights = np.asarray(cfg.reward_weights or [1.0] * len(self.rewards), np.float64)
        self.client = None
        if cfg.temperature != 1.0:  # the trainer's (and the reference's) log-probs over logits / T, as TRL's
            self.graph_kw = {"temperature": cfg.temperature}
        super().__init__(cfg, model, stream, dist=dist)
        record = {"type": "rollout_engine", "colocated": True, "kv_cache_bytes": int(self.runner.kv_bytes),
                  **({"engines": self.world} if self.world > 1 else {}),  # (one per rank, each its own cache)
                  "kv_cache_tokens": self.runner.num_blocks * BLOCK_SIZE, "max_num_seqs": self.max_num_seqs,
                  "weights": "shared with the trainer (one copy)",
                  "reference": None if self.ref_exe is None else
                  "the base, adapter off" if self.lora is not None else "a frozen copy of the starting weights",
                  "weight_bytes": int(sum(a.nbytes for a in self.model.params.values())),
                  "adapter": "the trainer's LoRA arrays" if self.lora is not None else None}
        if self.model.device != "cpu":  # what the device holds once trainer and engine are both set up
            from surogate import _native

            record["device_allocated_bytes"] = int(_native.allocator_stats(self.model.device)["allocated_bytes"])
        self.feed.write(record)

    # ---- setup ------------------------------------------------------------------------------
    def _datasets(self):
        return build_prompt_dataset(self.cfg, self.model.tokenizer), None

    def _tokens_per_row(self) -> int:
        c = self.cfg  # a "row" is one prompt's group
        return c.num_generations * (c.max_prompt_length + c.max_completion_length)

    def _build(self) -> None:
        m, c = self.model, self.cfg
        if m.quant:
            raise ConfigError(f"{c.model} is loaded with quantized (GGUF block) weights, which train no gradients",
                              where="model", hint="train GRPO on an HF folder or a dequantized GGUF")
        if c.temperature != 1.0 and m.spec.final_softcap:
            raise ConfigError(f"temperature {c.temperature}: {c.model} soft-caps its logits, and the trainer's "
                              "log-probs over capped logits / T are not built", where="temperature",
                              hint="use temperature: 1.0 with this model")
        if self.fp8 is not None and self.fp8.amax_history and self.world > 1:
            raise ConfigError("fp8_amax_history (delayed scaling) with several GRPO ranks: a rank without prompts in "
                              "a step runs no backward, so the ranks' histories would not line up to be merged",
                              where="fp8_amax_history", hint="use fp8_amax_history: 0 (current scaling) with GRPO on "
                                                             "several ranks")
        m.stack_qkv()  # q / k / v as views of one array: the engine's fused projection reads it, no copy
        super()._build()

    def _build_rank(self) -> None:
        """Each data-parallel rank's Programs, reference and engine (its share of the rollouts)."""
        super()._build_rank()
        self.ref_exe = self.reference_executable() if self.cfg.beta > 0 else None
        self._start_engine()

    def _start_engine(self) -> None:
        from surogate.serve.engine_client import EngineClient
        from surogate.serve.llm import LLM
        from surogate.serve.model_runner import ProgramRunner
        from surogate.serve.types import EngineConfig

        m, c = self.model, self.cfg
        seqs = self.B * c.gradient_accumulation_steps * c.num_generations  # every completion of a step at once
        ctx = c.max_prompt_length + c.max_completion_length
        self.max_num_seqs = min(seqs, 256)
        num_blocks = self.max_num_seqs * -(-ctx // BLOCK_SIZE) + 1
        self.runner = ProgramRunner(m, num_blocks, BLOCK_SIZE, fuse_qkv=True, max_num_seqs=self.max_num_seqs)
        self.adapter = None
        if self.lora is not None:
            serve_cfg = dataclasses.replace(self.lora, dropout=0.0)
            dev = None if m.device == "cpu" else {n: self.exe.tensor(n) for n in self.trainable}
            self.runner.bind_adapter(ADAPTER_SLOT, serve_cfg, self.trainable, dev)
            self.adapter = ADAPTER_SLOT
        tok = m.tokenizer
        self.client = EngineClient(self.runner, EngineConfig(
            num_blocks=num_blocks, block_size=BLOCK_SIZE, max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=max(2048, min(8192, seqs * 16)), max_model_len=ctx,
            eos_token_ids=list(tok.eos_token_ids), seed=c.seed))
        self.llm = LLM(self.client, tok, max_model_len=ctx)

    def close(self) -> None:
        """Every rank's engine of this process stopped."""
        for t in [self] + (self.dp.ranks[1:] if self.dp is not None else []):
            if t.client is not None:
                t.client.close()
                t.runner.close()
                t.client = None

    def train(self):
        try:
            return super().train()
        finally:
            self.close()

    def fingerprint(self) -> str:
        c = self.cfg
        key = [super().fingerprint(), "grpo", c.num_generations, c.max_prompt_length, c.max_completion_length,
               c.loss_type, c.beta, c.epsilon, c.clip_high, c.temperature, c.top_p, c.top_k, list(c.reward_functions),
               c.reward_weights, c.scale_rewards]
        if c.num_iterations != 1:  # appended only when set: older fingerprints stay valid
            key.append(["num_iterations", c.num_iterations])
        return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]

    # ---- rollouts ---------------------------------------------------------------------------
    def _sampling_params(self, step: int, index: int):
        from surogate.serve.types import SamplingParams

        c = self.cfg
        seed = int.from_bytes(hashlib.sha256(f"grpo:{c.seed}:{step}:{index}".encode()).digest()[:4], "little") >> 1
        return SamplingParams(n=c.num_generations, temperature=c.temperature, top_p=c.top_p, top_k=c.top_k,
                              max_tokens=c.max_completion_length, logprobs=0, detokenize=False, seed=seed)

    def rollout(self, samples: list[PromptSample], step: int, index: list[int] | None = None
                ) -> tuple[list[Rollout], float]:
        """num_generations completions per prompt (prompt-major), and the seconds they took;
        ``index``: each prompt's place in the step (its sampling seed's), default 0, 1, ..."""
        if not samples:  # (a data-parallel rank's share of a short last micro-batch)
            return [], 0.0
        self.client.reset_prefix_cache()  # cached blocks hold K / V of the weights before the last update
        t0 = time.perf_counter()
        params = [self._sampling_params(step, i) for i in (index if index is not None else range(len(samples)))]
        with self.client.held():  # every prompt x num_generations in before the engine's first step
            gen = self.llm.submit([s.prompt_ids for s in samples], params, adapter=self.adapter)
        with gen:
            outs = gen.result()
        dt = time.perf_counter() - t0
        eos = set(self.model.tokenizer.eos_token_ids)
        G, tok = self.cfg.num_generations, self.model.tokenizer
        rollouts = []
        for k, out in enumerate(outs):
            if out.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"rollout {k} ended with {out.finish_reason!r}: {out.finish_message}")
            ids = list(out.new_token_ids)
            logps = np.array([lp.logprob for lp in out.logprobs or []], np.float64)
            assert len(logps) == len(ids), "the engine returns one log-prob per sampled token"
            text = tok.decode([t for t in ids if t not in eos], skip_special_tokens=True)
            rollouts.append(Rollout(samples[k // G], ids, logps, text, out.finish_reason == "length"))
        return rollouts, dt

    def score(self, rollouts: list[Rollout]) -> np.ndarray:
        """[S, F] each reward function's value per completion."""
        return np.array([[call_reward(name, fn, r.sample.prompt, r.text, r.sample.row) for name, fn in self.rewards]
                         for r in rollouts], np.float64).reshape(len(rollouts), len(self.rewards))

    # ---- the micro-batch --------------------------------------------------------------------
    def _pack(self, rollouts: list[Rollout]) -> tuple[Batch, np.ndarray, list[np.ndarray]]:
        """The completions as documents of one row of N tokens; the positions whose target is a
        sampled token, in order (per completion: len(ids) of them)."""
        N = self.N
        ids = np.zeros(N, np.int32)
        pos = np.zeros(N, np.int32)
        targets = np.full(N, -100, np.int32)
        cu, at, where = [0], 0, []
        for r in rollouts:
            doc = r.sample.prompt_ids + r.ids
            n, p = len(doc), len(r.sample.prompt_ids)
            ids[at:at + n] = doc
            pos[at:at + n] = np.arange(n)
            targets[at + p - 1:at + n - 1] = r.ids  # position t predicts token t + 1
            where.append(np.arange(at + p - 1, at + n - 1))
            at += n
            cu.append(at)
        assert at <= N
        batch = Batch(ids, pos, np.asarray(cu, np.int32), targets, int(sum(len(r.ids) for r in rollouts)),
                      max(np.diff(cu)), 1, N)
        return batch, np.concatenate(where) if where else np.zeros(0, np.int64), where

    def _micro_batch(self, rollouts: list[Rollout], step: int, micro: int, num_seqs: int, num_tokens: int,
                     last: bool = False) -> dict:
        """``micro`` counts the micro-batches of every pass over the step's rollouts (its dropout
        seed); ``last``: this rank's last backward of the pass."""
        c = self.cfg
        self._dropout_seed(step, micro)
        batch, at, _ = self._pack(rollouts)
        self._load_batch(batch)
        ref = None
        if self.ref_exe is not None:
            self.ref_exe.run()
            ref = -np.asarray(self.ref_exe.read("loss"), np.float64)[at]
        self.exe.run("forward")
        logp = -np.asarray(self.exe.read("loss"), np.float64)[at]
        lens = np.array([len(r.ids) for r in rollouts])
        for r, mine in zip(rollouts, np.split(logp, np.cumsum(lens)[:-1])):
            if r.old is None:  # the first pass: the policy is still the one that sampled
                r.old = r.logps if c.temperature == 1.0 else mine.copy()
        old = np.concatenate([r.old for r in rollouts])
        adv = np.repeat([r.advantage for r in rollouts], lens)
        w = np.repeat(token_weights(c.loss_type, lens, num_seqs, num_tokens, c.max_completion_length), lens)
        out = grpo_token_loss(logp, old, ref, adv, w, beta=c.beta, eps_low=c.epsilon, eps_high=c.clip_high)
        dloss = self.inputs["dloss"]
        dloss[:] = 0.0
        dloss[at] = -out.dlogp
        self.exe.push("dloss")
        self._last_backward(last)
        self.exe.run("backward")
        return {"loss": out.loss, "kl": out.kl, "low": out.low_clipped, "high": out.high_clipped,
                "diff": np.abs(logp - np.concatenate([r.logps for r in rollouts]))}

    # ---- one step ---------------------------------------------------------------------------
    def _split(self, batch: list[PromptSample]) -> list[list[PromptSample]]:
        """A global micro-batch's prompts (B * R, fewer at an epoch's end): rank r's B of them."""
        return [batch[r * self.B:(r + 1) * self.B] for r in range(self.world)]

    def _step_with_metrics(self, batches: list[list[PromptSample]], step: int) -> tuple[float, int, dict]:
        """Every rank samples and scores its prompts' groups; the advantages from all the step's
        rewards (as one rank over the whole step computes them); then ``num_iterations`` passes
        of forward + backward on every rank, each but the last followed by its update."""
        c, G = self.cfg, self.cfg.num_generations
        shares = self._shares(batches)
        starts = np.cumsum([0] + [len(b) for b in batches])[:-1]  # each micro-batch's first prompt in the step
        firsts = [[int(s) + r * self.B for s in starts] for r in range(self.world)]
        sampled = self._on_ranks(lambda t: t._rollout_share(shares[t.rank], firsts[t.rank], step))
        units = in_step_order([u for u, _ in sampled])  # (rewards [n, F], lengths [n], truncated [n]) per micro-batch
        per_fn, lens, truncated = (np.concatenate([u[k] for u in units]) for k in range(3))
        adv = group_advantages(per_fn @ self.reward_weights, G, c.scale_rewards)
        advs = by_rank(np.split(adv, np.cumsum([len(u[1]) for u in units])[:-1]), self.world)
        num_seqs, num_tokens = len(lens), int(lens.sum())
        passes = []
        for i in range(c.num_iterations):
            if i > 0:  # the previous pass's update (the loop applies the last one)
                self._apply(self.schedule.lr_at(step + 1))
            parts = self._on_ranks(lambda t: t._learn_share(advs[t.rank], step, i, num_seqs, num_tokens), grads=True)
            passes.append(self._pass_result(in_step_order(parts), per_fn, lens, truncated))
        loss, tokens, m = passes[0]
        if len(passes) > 1:  # the loss and the ratio's metrics: means over the passes
            loss = float(np.mean([p[0] for p in passes]))
            for k in m:
                if k == "kl" or k.startswith("clip_ratio/"):
                    m[k] = float(np.mean([p[2][k] for p in passes]))
        rollout_time = max(dt for _, dt in sampled)
        m["rollout_time"] = round(rollout_time, 4)
        m["rollout_tokens_per_second"] = tokens / max(rollout_time, 1e-9)
        return loss, tokens, m

    def _rollout_share(self, units: list[list[PromptSample]], firsts: list[int], step: int) -> tuple[list, float]:
        """This rank's prompts (``units[m]``: its share of micro-batch m, the first at place
        ``firsts[m]`` of the step) sampled at once and scored; the completions stay here
        (``_units``); per micro-batch its (rewards, lengths, truncated) go back."""
        index = [f + j for f, u in zip(firsts, units) for j in range(len(u))]
        rollouts, dt = self.rollout([s for u in units for s in u], step, index)
        per_fn = self.score(rollouts)
        G, at = self.cfg.num_generations, 0
        self._units, out = [], []
        for u in units:
            n = len(u) * G
            mine = rollouts[at:at + n]
            self._units.append(mine)
            out.append((per_fn[at:at + n], np.array([len(r.ids) for r in mine], np.int64),
                        np.array([r.truncated for r in mine], bool)))
            at += n
        return out, dt

    def learn(self, rollouts: list[Rollout], per_fn: np.ndarray, prompts_per_micro: list[int],
              step: int, iteration: int = 0) -> tuple[float, int, dict]:
        """One rank's pass over rollouts it holds (the step's own path is `_step_with_metrics`):
        advantages, then forward + backward of each micro-batch (``prompts_per_micro[k]``
        prompts' groups, in order): gradients in the accumulators, the optimizer not run.
        ``iteration``: which of the step's ``num_iterations`` passes this is. Returns (this
        pass's loss, its completion tokens, the step line's metrics)."""
        G = self.cfg.num_generations
        cuts = np.cumsum([n * G for n in prompts_per_micro])[:-1]
        self._units = [rollouts[a:b] for a, b in zip([0, *cuts], [*cuts, len(rollouts)])]
        adv = group_advantages(per_fn @ self.reward_weights, G, self.cfg.scale_rewards)
        lens = np.array([len(r.ids) for r in rollouts], np.int64)
        parts = self._learn_share(np.split(adv, cuts), step, iteration, len(rollouts), int(lens.sum()))
        return self._pass_result(parts, per_fn, lens, np.array([r.truncated for r in rollouts], bool))

    def _learn_share(self, advantages: list[np.ndarray], step: int, iteration: int, num_seqs: int,
                     num_tokens: int) -> list[dict | None]:
        """Forward + backward of this rank's micro-batches (``_units``, with their advantages);
        ``num_seqs`` / ``num_tokens``: the whole step's completions and their tokens (the loss
        weights). The ratio's denominator (``Rollout.old``) is fixed by the first pass: the
        sampler's log-probs at temperature 1 (the distribution the trainer computes), else the
        trainer's own first-pass log-probs over logits / T (TRL's old_per_token_logps; the
        engine reports raw ones). Per micro-batch its values (None: no prompts of this rank)."""
        parts = []
        last = max((m for m, unit in enumerate(self._units) if unit), default=-1)  # this rank's last backward
        for m, (unit, adv) in enumerate(zip(self._units, advantages)):
            for r, a in zip(unit, adv):
                r.advantage = float(a)
            micro = iteration * len(self._units) + m  # counts every pass's micro-batches (the dropout seed)
            parts.append(self._micro_batch(unit, step, micro, num_seqs, num_tokens, m == last) if unit else None)
        return parts

    def _pass_result(self, parts: list[dict | None], per_fn, lens, truncated) -> tuple[float, int, dict]:
        """(a pass's loss, the step's completion tokens, the step line's metrics) from every
        micro-batch's values in the one-rank order and the step's rewards, lengths, truncations."""
        parts = [p for p in parts if p is not None]
        loss = sum(p["loss"] for p in parts)
        return loss, int(lens.sum()), self._metrics(per_fn, lens, truncated, parts)

    def _metrics(self, per_fn, lens, truncated, parts) -> dict:
        c = self.cfg
        G = c.num_generations
        total = per_fn @ self.reward_weights
        groups = total.reshape(-1, G)
        cat = {k: np.concatenate([p[k] for p in parts]) for k in ("kl", "low", "high", "diff")}
        m = {"reward": float(total.mean()), "reward_std": float(groups.std(axis=1, ddof=1).mean()),
             "frac_reward_zero_std": float((groups.std(axis=1) == 0).mean())}
        for (name, _), col in zip(self.rewards, per_fn.T):
            m[f"rewards/{name}/mean"] = float(col.mean())
            m[f"rewards/{name}/std"] = float(col.std(ddof=1)) if len(col) > 1 else 0.0
        if c.beta > 0:
            m["kl"] = float(cat["kl"].mean())
        m["clip_ratio/low_mean"] = float(cat["low"].mean())
        m["clip_ratio/high_mean"] = float(cat["high"].mean())
        m["clip_ratio/region_mean"] = float((cat["low"] | cat["high"]).mean())
        m["completions/mean_length"] = float(lens.mean())
        m["completions/min_length"] = int(lens.min())
        m["completions/max_length"] = int(lens.max())
        m["completions/clipped_ratio"] = float(np.mean(truncated))
        if c.temperature == 1.0:  # the engine's log-probs are raw: comparable to the trainer's at T = 1 only
            m["sampling/sampling_logp_difference/mean"] = float(cat["diff"].mean())
            m["sampling/sampling_logp_difference/max"] = float(cat["diff"].max())
        return m
