"""What the registry-driven tests cannot see of Gemma 4: its layer scalars (transformers
initialises them to 1, the real checkpoints do not) and its refusals by config key."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import surogate  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.errors import UnsupportedError  # noqa: E402
from surogate.models import gemma4  # noqa: E402


def test_layer_scalars_from_the_checkpoint_scale_each_layer(tmp_path):
    path = make_model("gemma4", tmp_path / "m", seed=5)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        for i, layer in enumerate(ref.model.layers):
            layer.layer_scalar.fill_(0.5 + 0.25 * i)
    ref.save_pretrained(path)
    ours = surogate.load_model(path)
    ids = np.random.default_rng(2).integers(0, ours.spec.vocab_size, size=19)
    expected = ref(torch.tensor(ids)[None]).logits[0].detach().numpy()
    np.testing.assert_allclose(ours.forward(ids), expected, atol=1e-4, rtol=0)
    assert float(ours.params["layers.3.layer_scalar"][0]) == 1.25


@pytest.mark.parametrize("key, value", [("enable_moe_block", True), ("use_bidirectional_attention", "all")])
def test_moe_and_bidirectional_configs_are_refused_by_name(key, value):
    config = {"vocab_size": 512, **gemma4.FAMILY.tiny.config, key: value}
    with pytest.raises(UnsupportedError, match=key):
        gemma4.spec_from_config(config)


def test_kv_sharing_reads_the_last_earlier_layer_of_each_kind():
    types = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    assert gemma4.kv_sources(types, 2) == [0, 1, 2, 1, 2]
    spec = gemma4.spec_from_config({"vocab_size": 512, **gemma4.FAMILY.tiny.config})
    assert spec.cache_layers() == [0, 1, 2]
    assert [spec.head_dim_of(i) for i in range(5)] == [16, 16, 32, 16, 32]
    assert spec.layer_intermediate_sizes == [96, 96, 96, 192, 192]  # double-wide where K / V are shared
