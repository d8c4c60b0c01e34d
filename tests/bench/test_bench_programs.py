"""The benchmark programs run and print their tables (smallest settings; timings not checked)."""

import pytest

pytest.importorskip("torch")


def test_bench_train_prints_both_rows(capsys):
    from surogate.bench.train import run

    results = run("tiny", batch=1, seq=32, lora_rank=4, dtype="float32", steps=1, warmup=0, vs="hf",
                  device="cpu", recompute=False)
    out = capsys.readouterr().out
    assert "surogate" in out and "HF transformers + peft" in out and "x" in out
    assert "first-step losses agree" in out  # the same weights and batch on both sides
    assert all(r.tokens_per_second > 0 for r in results)


def test_bench_serve_prints_both_rows(capsys):
    from surogate.bench.serve import run

    results = run("tiny", n=2, prompt_len=8, output_len=3, dtype="float32", vs="hf", device="cpu")
    out = capsys.readouterr().out
    assert "HF generate" in out and "ratio" in out
    assert "of the memory-bandwidth roofline" in out
    assert results[0].ttft_p50 is not None and results[0].output_tokens_per_s > 0


def test_bench_serve_with_weights_in_host_memory_prints_the_link_ceiling(capsys):
    from surogate.bench.serve import run

    resident, streamed = run("tiny", n=2, prompt_len=8, output_len=3, dtype="float32", vs=None, device="cpu",
                             cpu_offload_gb=0.001)
    out = capsys.readouterr().out
    assert "--cpu-offload-gb 0.001" in out and "host-link ceiling" in out and "GB/s" in out
    assert "of the host-link ceiling" in out
    assert resident.output_tokens_per_s > 0 and streamed.output_tokens_per_s > 0


def test_bench_grpo_prints_both_modes_and_the_serving_engine(capsys):
    from surogate.bench.grpo import run

    run("tiny", prompts=2, generations=2, prompt_len=8, completion_len=4, dtype="float32", device="cpu", steps=1,
        warmup=0, lora_rank=4)
    out = capsys.readouterr().out
    assert "co-located" in out and "separate copy" in out and "co-located / separate" in out
    assert "serving engine" in out and "co-located / serving x" in out


def test_bench_train_takes_an_hf_config(tmp_path, capsys):
    from sgtest.tiny_models import make_qwen3

    from surogate.bench.train import run

    folder = make_qwen3(tmp_path / "q", seed=0, num_hidden_layers=1)
    run(str(folder / "config.json"), batch=1, seq=16, lora_rank=0, dtype="float32", steps=1, warmup=0, vs="hf",
        device="cpu", recompute=False)
    out = capsys.readouterr().out
    assert "config.json, full fine-tune" in out and "first-step losses agree" in out


def test_bench_train_qlora_trains_over_blocks_with_the_same_first_loss():
    """--qlora: our side over GGML blocks (the projections really are blocks) scores the first batch as
    the same random model in f32 does, within Q8_0's rounding; the peer (bitsandbytes) is the GPU's."""
    from surogate.bench.train import quantized, random_model, run

    q = quantized(random_model("tiny", "float32"), "Q8_0")
    assert q.quant and all(q.params[n].dtype.name == "uint8" for n in q.quant)
    plain = run("tiny", batch=1, seq=32, lora_rank=4, dtype="float32", steps=1, warmup=0, vs=None,
                device="cpu", recompute=False)
    blocks = run("tiny", batch=1, seq=32, lora_rank=4, dtype="float32", steps=1, warmup=0, vs=None,
                 device="cpu", recompute=False, qlora="Q8_0")
    assert blocks[0].loss == pytest.approx(plain[0].loss, rel=1e-3)
    with pytest.raises(Exception, match="--qlora trains a LoRA"):
        run("tiny", batch=1, seq=32, lora_rank=0, dtype="float32", steps=1, warmup=0, vs=None, device="cpu",
            recompute=False, qlora="Q8_0")


def test_bench_train_fp8_runs_both_recipes_from_the_same_weights(capsys):
    """--fp8 (full fine-tune): the fp8_hybrid side's steps update the weights in place; the bf16 side
    after it starts from the same weights (its first loss is a lone bf16 run's), and the HF peer too."""
    from surogate.bench.train import run

    kw = dict(batch=1, seq=32, lora_rank=0, dtype="float32", steps=2, warmup=1, device="cpu", recompute=False)
    fp8, plain, peer = run("tiny", vs="hf", fp8=True, **kw)
    alone = run("tiny", vs=None, **kw)[0]
    out = capsys.readouterr().out
    assert "fp8_hybrid" in fp8.name and "fp8_hybrid" in out
    assert plain.loss == alone.loss and plain.loss == pytest.approx(peer.loss, rel=1e-3)
    assert fp8.loss != plain.loss and fp8.loss == pytest.approx(plain.loss, rel=2e-2)
