"""LoRA files and merging against peft: our adapter files load in peft, peft's load in ours,
and `surogate merge` gives the weights peft's merge_and_unload gives."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from sgtest.tiny_models import make_llama  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402
from surogate.train.export import merge_adapter  # noqa: E402
from surogate.train.lora import load_peft_adapter, save_peft_adapter  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_llama(tmp_path_factory.mktemp("base"), seed=5)


def peft_model(base_path, seed=0):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(base_path), dtype=torch.float32)
    pm = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return pm.eval()


def test_peft_adapter_round_trips_through_our_files(base, tmp_path):
    pm = peft_model(base)
    pm.save_pretrained(tmp_path / "peft")
    cfg, params = load_peft_adapter(tmp_path / "peft")
    assert cfg.rank == 4 and cfg.alpha == 8 and set(cfg.targets) == set(TARGETS)
    assert "layers.1.mlp.gate_proj.lora_B" in params
    ref = {n.removeprefix("base_model.model.model.").replace(".default.weight", ""): p.detach().numpy()
           for n, p in pm.named_parameters() if "lora_" in n}
    assert set(ref) == set(params)
    for n in ref:
        np.testing.assert_array_equal(params[n], ref[n])

    # Written back by us, loaded by peft: the same model output.
    save_peft_adapter(tmp_path / "ours", params, cfg, base_model=str(base))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    again = peft.PeftModel.from_pretrained(model, str(tmp_path / "ours")).eval()
    ids = torch.arange(3, 20)[None]
    with torch.no_grad():
        np.testing.assert_allclose(again(ids).logits.numpy(), pm(ids).logits.numpy(), atol=1e-6)


def test_merge_equals_peft_merge_and_unload(base, tmp_path):
    pm = peft_model(base, seed=1)
    pm.save_pretrained(tmp_path / "adapter")
    out = merge_adapter(None, tmp_path / "adapter", tmp_path / "merged")
    assert (out / "tokenizer.json").is_file() and (out / "config.json").is_file()
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ref = pm.merge_and_unload().eval()
    ids = torch.arange(1, 30)[None]
    with torch.no_grad():
        np.testing.assert_allclose(merged(ids).logits.numpy(), ref(ids).logits.numpy(), atol=1e-5)
    # Merging again over an existing output replaces it whole.
    merge_adapter(str(base), tmp_path / "adapter", tmp_path / "merged")
    assert not list(tmp_path.glob(".merged.*"))


def test_merge_rejects_an_adapter_for_another_model(base, tmp_path):
    from surogate.errors import FileFormatError

    params = {"layers.9.self_attn.q_proj.lora_A": np.zeros((4, 64), np.float32),
              "layers.9.self_attn.q_proj.lora_B": np.zeros((64, 4), np.float32)}
    save_peft_adapter(tmp_path / "bad", params, LoRAConfig(rank=4, alpha=8), base_model=str(base))
    with pytest.raises(FileFormatError, match="layers.9"):
        merge_adapter(None, tmp_path / "bad", tmp_path / "m")


def test_a_dense_adapter_of_gate_proj_alone_round_trips(base, tmp_path):
    """gate_proj without up_proj is refused only on a MoE layer's experts (stacked together):
    a dense model's adapter of it reads and merges as before."""
    from surogate.train.lora import merge_into_hf

    peft = pytest.importorskip("peft")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    pm = peft.get_peft_model(ref, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["gate_proj"]))
    pm.save_pretrained(tmp_path / "peft")
    cfg, params = load_peft_adapter(tmp_path / "peft")
    assert cfg.targets == ("gate_proj",) and "layers.0.mlp.gate_proj.lora_A" in params
    hf = {"model.layers.0.mlp.gate_proj.weight": np.zeros((params["layers.0.mlp.gate_proj.lora_B"].shape[0],
                                                           params["layers.0.mlp.gate_proj.lora_A"].shape[1]),
                                                          np.float32)}
    one = {k: v for k, v in params.items() if k.startswith("layers.0.")}
    merged = merge_into_hf(hf, one, cfg)["model.layers.0.mlp.gate_proj.weight"]
    A, B = one["layers.0.mlp.gate_proj.lora_A"], one["layers.0.mlp.gate_proj.lora_B"]
    np.testing.assert_allclose(merged, cfg.scale * B @ A, rtol=1e-6, atol=1e-7)
