"""`surogate bench train`: training-step throughput, ours and the peer's in the same run.

Ours: the model's training Program (forward, backward, AdamW) on random weights. The peer: HF
transformers (+ peft for LoRA) with torch's AdamW on the same shape, tokens and device. Both
see the same packed batch of `batch x seq` tokens (one document per row).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from surogate.bench.shapes import hf_config, spec_for
from surogate.dsl.nn import LoRAConfig
from surogate.model import Model, _np_dtype
from surogate.models import FAMILIES
from surogate.train.lora import ALL_TARGETS, init_lora
from surogate.train.optimizer import AdamW, AdamWParams


@dataclass
class Result:
    name: str
    tokens_per_second: float
    step_seconds: float
    loss: float


def random_model(shape: str, dtype: str, seed: int = 0) -> Model:
    spec = spec_for(shape)
    family = FAMILIES["Qwen3ForCausalLM" if spec.family == "qwen3" else "LlamaForCausalLM"]
    probe = Model(spec, family, {}, dtype=dtype)
    g = probe.arch.build(mode="logits", dtype=dtype)
    rng = np.random.default_rng(seed)
    params = {}
    for p in g.params():
        if p.name.endswith("norm.weight"):
            arr = np.ones(p.shape, np.float32)
        else:
            arr = rng.standard_normal(p.shape, dtype=np.float32) * 0.02
        params[p.name] = arr.astype(_np_dtype(dtype))
    return Model(spec, family, params, dtype=dtype)


def bench_ours(model: Model, batch: int, seq: int, lora: LoRAConfig | None, steps: int, warmup: int,
               recompute: bool) -> Result:
    n = batch * seq
    exe = model.executable("train", n, batch, lora=lora, grads=True, recompute=recompute)
    if lora is not None:
        trainable = {k: v.astype(_np_dtype(model.dtype)) for k, v in init_lora(exe.graph, 0).items()}
        for k, v in trainable.items():
            exe.bind(k, v)
    else:
        trainable = {k: model.params[k] for k in exe.external_names("param")}
    for name in exe.external_names("grad"):
        exe.bind(name, np.zeros(exe.buf(name).shape, np.float32))
    opt = AdamW(exe, trainable, AdamWParams(lr=1e-5))
    rng = np.random.default_rng(1)
    exe.bind("input_ids", rng.integers(0, model.spec.vocab_size, n).astype(np.int32))
    exe.bind("position_ids", np.tile(np.arange(seq, dtype=np.int32), batch))
    exe.bind("cu_seqlens", (np.arange(batch + 1) * seq).astype(np.int32))
    targets = rng.integers(0, model.spec.vocab_size, n).astype(np.int32)
    exe.bind("targets", targets)
    exe.bind("dloss", np.full(n, 1.0 / n, np.float32))
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        exe.program.run(0, opt.begin)
        opt.apply(1e-5)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    loss = float(exe.read("loss").mean())
    dt = float(np.median(times))
    return Result("surogate", n / dt, dt, loss)


def bench_hf(model: Model, batch: int, seq: int, lora: LoRAConfig | None, steps: int, warmup: int,
             device: str) -> Result:
    import torch
    import transformers

    spec = model.spec
    cfg_cls = transformers.Qwen3Config if spec.family == "qwen3" else transformers.LlamaConfig
    model_cls = transformers.Qwen3ForCausalLM if spec.family == "qwen3" else transformers.LlamaForCausalLM
    dtype = torch.bfloat16 if model.dtype == "bfloat16" else torch.float32
    cfg = cfg_cls(**hf_config(spec))
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    m = model_cls(cfg).to(device=device, dtype=dtype)
    if lora is not None:
        import peft

        m = peft.get_peft_model(m, peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha,
                                                   target_modules=list(lora.targets), lora_dropout=0.0))
    params = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, fused=device != "cpu")
    rng = np.random.default_rng(1)
    ids = torch.tensor(rng.integers(0, spec.vocab_size, (batch, seq)), device=device)
    labels = torch.tensor(rng.integers(0, spec.vocab_size, (batch, seq)), device=device)
    times = []
    loss = float("nan")
    for i in range(warmup + steps):
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = m(input_ids=ids, labels=labels)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device != "cpu":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        loss = out.loss.item()
    dt = float(np.median(times))
    label = "HF transformers" + (" + peft" if lora is not None else "")
    return Result(label, batch * seq / dt, dt, loss)


def run(shape: str, *, batch: int, seq: int, lora_rank: int, dtype: str, steps: int, warmup: int, vs: str | None,
        device: str, recompute: bool) -> list[Result]:
    model = random_model(shape, dtype)
    lora = LoRAConfig(rank=lora_rank, alpha=2 * lora_rank, targets=ALL_TARGETS) if lora_rank > 0 else None
    results = [bench_ours(model, batch, seq, lora, steps, warmup, recompute)]
    if vs == "hf":
        results.append(bench_hf(model, batch, seq, lora, steps, warmup, device))
    mode = f"LoRA r{lora_rank}" if lora else "full fine-tune"
    print(f"\n{shape}, {mode}, {dtype}, batch {batch} x {seq} tokens, {device}, median of {steps} steps")
    print(f"{'':22} {'tokens/s':>12} {'step (s)':>10} {'loss':>8} {'ratio':>7}")
    base = results[-1].tokens_per_second if len(results) > 1 else results[0].tokens_per_second
    for r in results:
        ratio = r.tokens_per_second / base
        print(f"{r.name:22} {r.tokens_per_second:12,.0f} {r.step_seconds:10.3f} {r.loss:8.4f} {ratio:6.2f}x")
    if len(results) > 1 and not math.isclose(results[0].loss, results[1].loss, rel_tol=0.05):
        print("note: losses differ (different random weights; each side initializes its own)")
    return results
