"""Gemma 3's vision tower as llama.cpp ships it: the mmproj GGUF beside the text GGUF.

`surogate quantize` of a Gemma3ForConditionalGeneration writes the text GGUF and
mmproj-<name>.gguf; read back with gguf-py, every key and tensor of the mmproj equals what
llama.cpp's convert_hf_to_gguf.py --mmproj --outtype f16 writes (its MmprojModel and
Gemma3VisionModel, restated below from that source: names through gguf-py's own MMPROJ tensor
map, soft_emb_norm + 1, the types of its prepare_tensors / tensor_force_quant). Served with
``mmproj=`` (``surogate serve model.gguf --mmproj mmproj.gguf``), the GGUF pair encodes images and
answers a chat with an image exactly as the HF folder does (tests/serve/test_vision_serving.py
holds the folder to transformers); the tower's weights are made f16-exact first so that the
mmproj's F16 storage loses nothing. An mmproj of another projector, or of another text width, is
refused naming the key.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

from sgtest.gguf_edit import copy_gguf  # noqa: E402
from sgtest.vision import image, make_gemma3_vision_chat, template_messages  # noqa: E402
from surogate import load_model  # noqa: E402
from surogate.errors import ConfigError, UnsupportedError  # noqa: E402
from surogate.io import ModelFolder  # noqa: E402
from surogate.models import family_named  # noqa: E402
from surogate.models.gguf_names import mmproj_path, quantize_to_gguf  # noqa: E402
from surogate.serve import SamplingParams  # noqa: E402
from surogate.serve.launch import launch  # noqa: E402

# llama.cpp's fixed Gemma 3 choices (tiny_models' GGUF config: two sliding layers), with a window that
# reaches back from the answer to the image.
TEXT_GGUF = {**family_named("gemma3").tiny.gguf, "sliding_window": 64}
VISION = ("vision_tower.", "multi_modal_projector.")


def _f16_exact(folder):
    """Round the tower's and projector's weights to f16 values (kept f32) in the folder."""
    from safetensors.numpy import load_file, save_file

    (path,) = folder.glob("*.safetensors")
    t = load_file(path)
    save_file({k: v.astype(np.float16).astype(np.float32) if k.startswith(VISION) else v for k, v in t.items()},
              path, metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return _f16_exact(make_gemma3_vision_chat(tmp_path_factory.mktemp("g3m") / "tiny-gemma3-vision", seed=5,
                                              text=TEXT_GGUF))


@pytest.fixture(scope="module")
def files(folder, tmp_path_factory):
    out = quantize_to_gguf(folder, tmp_path_factory.mktemp("g3m_out") / "tiny.gguf", "F32")
    return out, mmproj_path(out)


# ---- what llama.cpp's converter writes (convert_hf_to_gguf.py, restated) --------------------------------

def _hub_name(name: str) -> str:
    # The hub's layout, which the converter's tensor map knows (transformers 5 saves vision_tower.* bare).
    if name.startswith("vision_tower.") and not name.startswith("vision_tower.vision_model."):
        return "vision_tower.vision_model." + name[len("vision_tower."):]
    return name.removeprefix("model.")


def expected_tensors(folder) -> dict[str, tuple[str, np.ndarray]]:
    """GGUF name -> (type, values) as Gemma3VisionModel writes them at --outtype f16."""
    cfg = json.loads((folder / "config.json").read_text())
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, cfg["vision_config"]["num_hidden_layers"])
    weights = ModelFolder(folder).open_weights()
    out = {}
    for ckpt in weights.keys():  # noqa: SIM118
        name = _hub_name(ckpt)
        if not name.startswith(VISION) or "vision_model.head." in name:
            continue
        name = name.replace("_weight", ".weight")
        data = np.asarray(weights.get(ckpt), np.float32)
        if "soft_emb_norm.weight" in name:
            data = data + 1
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new is not None, name
        force = "F16" if "input_projection" in name else "F32" if ".embeddings." in name else None
        if data.ndim <= 1 or new.endswith("_norm.weight"):
            force = "F32"
        qtype = force or "F16"  # ftype MOSTLY_F16
        out[new] = (qtype, data.astype(np.float16 if qtype == "F16" else np.float32))
    return out


def expected_keys(folder) -> dict:
    cfg = json.loads((folder / "config.json").read_text())
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    pre.update(json.loads((folder / "processor_config.json").read_text()))
    vc, tc = cfg["vision_config"], cfg["text_config"]
    side = int(pre.get("image_seq_length", 256) ** 0.5)
    keys = {"general.architecture": "clip", "general.type": "mmproj", "general.file_type": 1,
            "general.quantization_version": 2, "general.name": folder.name,
            "clip.has_vision_encoder": True, "clip.vision.projection_dim": tc["hidden_size"],
            "clip.vision.image_size": vc["image_size"], "clip.vision.patch_size": vc["patch_size"],
            "clip.vision.embedding_length": vc["hidden_size"],
            "clip.vision.feed_forward_length": vc["intermediate_size"],
            "clip.vision.block_count": vc["num_hidden_layers"], "clip.vision.attention.head_count":
            vc["num_attention_heads"], "clip.vision.image_mean": pre["image_mean"], "clip.vision.image_std":
            pre["image_std"], "clip.projector_type": "gemma3",
            "clip.vision.attention.layer_norm_epsilon": vc.get("layer_norm_eps", 1e-6), "clip.use_gelu": True}
    scale = (vc["image_size"] // vc["patch_size"]) // side
    if scale > 0 and scale != 4:
        keys["clip.vision.projector.scale_factor"] = scale
    return keys


def _fields(path) -> dict:
    r = gguf.GGUFReader(path)
    return r, {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def test_quantize_writes_the_mmproj_llama_cpp_writes(folder, files):
    text, vision = files
    r, fields = _fields(vision)
    want = expected_keys(folder)
    assert set(fields) == set(want)
    for k, v in want.items():
        if isinstance(v, float) or (isinstance(v, list) and isinstance(v[0], float)):
            np.testing.assert_array_equal(np.float32(fields[k]), np.float32(v), err_msg=k)
        else:
            assert fields[k] == v, k
    assert r.fields["clip.vision.image_size"].types == [gguf.GGUFValueType.UINT32]
    tensors = expected_tensors(folder)
    assert sorted(t.name for t in r.tensors) == sorted(tensors)
    for t in r.tensors:
        qtype, values = tensors[t.name]
        assert t.tensor_type.name == qtype, t.name
        np.testing.assert_array_equal(np.asarray(t.data).reshape(values.shape), values, err_msg=t.name)
    # The patch conv as HF's [C, 3, P, P] (ggml ne P, P, 3, C); the projection untransposed [vision, text].
    by_name = {t.name: t for t in r.tensors}
    cfg = json.loads((folder / "config.json").read_text())
    vc, hidden = cfg["vision_config"], cfg["text_config"]["hidden_size"]
    assert list(by_name["v.patch_embd.weight"].shape) == [vc["patch_size"], vc["patch_size"], 3, vc["hidden_size"]]
    assert list(by_name["mm.input_projection.weight"].shape) == [hidden, vc["hidden_size"]]
    # The text GGUF holds the language model only, and its tokenizer the image tokens.
    tr, tfields = _fields(text)
    assert tfields["general.architecture"] == "gemma3"
    assert not [t.name for t in tr.tensors if t.name.startswith(("v.", "mm."))]
    tokens = tfields["tokenizer.ggml.tokens"]
    for tok, key in (("<start_of_image>", "boi_token_index"), ("<end_of_image>", "eoi_token_index"),
                     ("<image_soft_token>", "image_token_index")):
        assert tokens.index(tok) == cfg[key]


@pytest.mark.parametrize("layout", ["hub", "transformers4"])
def test_every_checkpoint_layout_writes_the_same_files(folder, files, tmp_path, layout):
    # The hub's files (language_model.model.*, vision_tower.vision_model.*) and transformers 4.5x's
    # save_pretrained (model.language_model.*, model.vision_tower.vision_model.*, model.multi_modal_projector.*).
    import shutil

    from safetensors.numpy import load_file, save_file

    def rename(name: str) -> str:
        name = _hub_name(name)
        if layout == "transformers4":
            for old, new in (("language_model.model.", "model.language_model."),
                             ("vision_tower.", "model.vision_tower."),
                             ("multi_modal_projector.", "model.multi_modal_projector.")):
                if name.startswith(old):
                    return new + name[len(old):]
        return name

    other = tmp_path / folder.name
    shutil.copytree(folder, other)
    (path,) = other.glob("*.safetensors")
    save_file({rename(k): v for k, v in load_file(path).items()}, path, metadata={"format": "pt"})
    out = quantize_to_gguf(other, tmp_path / "tiny.gguf", "F32")
    assert out.read_bytes() == files[0].read_bytes()
    assert mmproj_path(out).read_bytes() == files[1].read_bytes()


def test_mmproj_encodes_images_as_the_folder(folder, files):
    text, vision = files
    hf, ours = load_model(str(folder)), load_model(str(text), mmproj=str(vision))
    assert ours.spec.vision.mm_tokens_per_image == hf.spec.vision.mm_tokens_per_image
    assert ours.spec.vision.image_token_index == hf.spec.vision.image_token_index
    pixels = np.random.default_rng(0).uniform(-1, 1, (2, 3, 56, 56)).astype(np.float32)
    np.testing.assert_allclose(ours.encode_images(pixels), hf.encode_images(pixels), rtol=1e-5, atol=1e-6)


def test_a_quantized_text_gguf_keeps_its_blocks_and_the_tower_from_the_mmproj(folder, tmp_path):
    text = quantize_to_gguf(folder, tmp_path / "q8.gguf", "Q8_0")
    hf, ours = load_model(str(folder)), load_model(str(text), mmproj=str(mmproj_path(text)), quantized=True)
    assert ours.quant and not [n for n in ours.quant if n.startswith(("vision", "multi_modal"))]
    pixels = np.random.default_rng(1).uniform(-1, 1, (1, 3, 56, 56)).astype(np.float32)
    np.testing.assert_allclose(ours.encode_images(pixels), hf.encode_images(pixels), rtol=1e-5, atol=1e-6)


def test_gguf_and_mmproj_serve_images_as_the_folder(folder, files):
    text, vision = files
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
    messages = [{"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "image", "image": image(7)},
                                             {"type": "text", "text": "please"}]}]
    chat, images = template_messages(messages)
    answers, logprobs = [], []
    for source, kw in ((str(folder), {}), (str(text), {"mmproj": str(vision)})):
        m = launch(source, kv_cache_tokens=512, **kw)
        try:
            assert m.images is not None
            llm = m.llm()
            prompt = llm.render(chat, images=images).token_ids
            out = llm.chat(chat, greedy, images=images).result(timeout=120)[0]
            other = llm.chat(chat, greedy, images=[image(8)]).result(timeout=120)[0]
            assert [t.logprob for t in other.logprobs] != [t.logprob for t in out.logprobs]  # the image counts
            answers.append((prompt, list(out.new_token_ids)))
            logprobs.append([t.logprob for t in out.logprobs])
        finally:
            m.client.close()
    assert answers[0] == answers[1]
    np.testing.assert_allclose(logprobs[0], logprobs[1], rtol=1e-5, atol=1e-5)
    cfg = json.loads((folder / "config.json").read_text())
    assert answers[0][0].count(cfg["image_token_index"]) == cfg["mm_tokens_per_image"]


def test_mmproj_of_another_projector_or_width_is_refused(files, tmp_path):
    text, vision = files
    other = copy_gguf(vision, tmp_path / "llava.gguf", clip__projector_type="mlp")
    with pytest.raises(UnsupportedError, match="clip.projector_type"):
        load_model(str(text), mmproj=str(other))
    wide = copy_gguf(vision, tmp_path / "wide.gguf", clip__vision__projection_dim=512)
    with pytest.raises(ConfigError, match="clip.vision.projection_dim"):
        load_model(str(text), mmproj=str(wide))


def test_cli_quantize_writes_both_files_and_serve_takes_mmproj(folder, files, tmp_path):
    import os
    import subprocess
    import sys

    def run(*args):
        return subprocess.run([sys.executable, "-P", "-m", "surogate.cli.main", *args], capture_output=True,
                              text=True, timeout=300, env=dict(os.environ))

    out = tmp_path / "cli.gguf"
    proc = run("quantize", str(folder), "--type", "F32", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {mmproj_path(out)}" in proc.stdout
    assert mmproj_path(out).read_bytes() == files[1].read_bytes()  # the same writer, deterministic
    proc = run("serve", str(folder), "--device", "cpu", "--mmproj", str(files[1]))
    assert proc.returncode != 0 and "--mmproj (mmproj=) goes with a GGUF model" in proc.stdout + proc.stderr
