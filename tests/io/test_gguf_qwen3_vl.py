"""Qwen3-VL and Qwen3-VL-MoE as llama.cpp ships them: the qwen3vl / qwen3vlmoe text GGUF beside its
mmproj (surogate/models/qwen3_vl_gguf.py), every test for each family.

`surogate quantize` of a tiny random Qwen3VLForConditionalGeneration (sgtest/vision.py
make_qwen3_vl_chat), or of a Qwen3VLMoeForConditionalGeneration whose text layers are all sparse,
writes the text GGUF and mmproj-<name>.gguf; read back with gguf-py, every key and tensor equals
what llama.cpp's convert_hf_to_gguf.py (Qwen3VLTextModel / Qwen3VLMoeTextModel, Qwen3VLVisionModel
at --outtype f16) writes, restated below from that source with gguf-py's own names (Keys, the
MMPROJ tensor map, MODEL_TENSORS[QWEN3VL / QWEN3VLMOE], the V_DS_* and V_MMPROJ formats): the patch
Conv3d as two temporal halves, the fused qkv, the DeepStack mergers numbered by the block they
follow, the position grid F32; the MoE's router and its experts split and permuted from the hub's
[E, in, out] layout, and the expert keys. Loaded as a pair (``load_model(text, mmproj=)``) the model
gives transformers' logits on an image prompt and on a video prompt (f32, 1e-4); the text GGUF
alone is the language model; a Q8_0 text GGUF keeps its blocks; served as a pair it answers chats
with images and videos exactly as the folder does (the folder's processor configs are the ones an
mmproj implies: clip.cpp's 8 to 4096 tokens per image, the video processor's defaults). The
tower's weights are made f16-exact first, so the mmproj's F16 storage loses nothing. Mismatched
files are refused naming the key; a Qwen3-VL-MoE with a dense text layer is refused before any
file is written.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers.models.qwen3_vl")

from sgtest.tiny_models import qwen3_vl_prompts  # noqa: E402
from sgtest.gguf_edit import copy_gguf  # noqa: E402
from sgtest.vision import (QWEN3_VL_PREPROCESSOR, image, make_qwen3_vl_chat, qwen3_vl_hf_logits,  # noqa: E402
                           template_messages)
from surogate import load_model  # noqa: E402
from surogate.errors import ConfigError, UnsupportedError  # noqa: E402
from surogate.io import ModelFolder  # noqa: E402
from surogate.models.gguf_names import mmproj_path, quantize_to_gguf  # noqa: E402
from surogate.serve import SamplingParams  # noqa: E402
from surogate.serve.launch import launch  # noqa: E402

# family -> (llama.cpp's architecture, text_config keys over the tiny config's: the MoE's every layer sparse)
FORMS = {"qwen3_vl": (gguf.MODEL_ARCH.QWEN3VL, {}), "qwen3_vl_moe": (gguf.MODEL_ARCH.QWEN3VLMOE, {"mlp_only_layers": []})}
AREA = (8 * 2) ** 2  # the tiny tower's merged token: 8-pixel patches, merge 2
# What an mmproj implies for the processors (qwen3_vl_gguf.mmproj_processor_configs): the folder holds the same.
PREPROCESSOR = {**QWEN3_VL_PREPROCESSOR, "size": {"shortest_edge": 8 * AREA, "longest_edge": 4096 * AREA}}
VIDEO_PREPROCESSOR = {k: QWEN3_VL_PREPROCESSOR[k] for k in ("patch_size", "temporal_patch_size", "merge_size",
                                                              "image_mean", "image_std")}


@pytest.fixture(scope="module", params=sorted(FORMS))
def family(request):
    return request.param


def arch_of(folder) -> gguf.MODEL_ARCH:
    return gguf.MODEL_ARCH.QWEN3VLMOE if "Moe" in json.loads((folder / "config.json").read_text())["architectures"][0] \
        else gguf.MODEL_ARCH.QWEN3VL


@pytest.fixture(scope="module")
def folder(family, tmp_path_factory):
    from safetensors.numpy import load_file, save_file

    path = make_qwen3_vl_chat(tmp_path_factory.mktemp("q3vl_gguf") / "tiny-qwen3vl", seed=5,
                              moe=family == "qwen3_vl_moe", text=FORMS[family][1])
    (path / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    (path / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_PREPROCESSOR))
    (st,) = path.glob("*.safetensors")
    t = load_file(st)
    save_file({k: v.astype(np.float16).astype(np.float32) if ".visual." in f".{k}" else v for k, v in t.items()}, st,
              metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def files(folder, tmp_path_factory):
    out = quantize_to_gguf(folder, tmp_path_factory.mktemp("q3vl_gguf_out") / "tiny.gguf", "F32")
    return out, mmproj_path(out)


@pytest.fixture(scope="module")
def hf(folder):
    import transformers

    arch = json.loads((folder / "config.json").read_text())["architectures"][0]
    return getattr(transformers, arch).from_pretrained(str(folder), dtype=torch.float32).eval()


def _fields(path):
    r = gguf.GGUFReader(path)
    return r, {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


# ---- what llama.cpp's converter writes (convert_hf_to_gguf.py, restated) --------------------------------

def expected_mmproj_tensors(folder) -> dict[str, tuple[str, np.ndarray]]:
    """GGUF name -> (type, values) as Qwen3VLVisionModel.modify_tensors + MmprojModel write them at f16."""
    cfg = json.loads((folder / "config.json").read_text())
    vc = cfg["vision_config"]
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, vc["depth"])
    names = gguf.TENSOR_NAMES
    weights = ModelFolder(folder).open_weights()
    out = {}
    for ckpt in weights.keys():  # noqa: SIM118
        if not ckpt.startswith("model.visual."):
            continue
        name = ckpt.replace("model.visual.", "visual.", 1)
        data = np.asarray(weights.get(ckpt), np.float32)
        if name.startswith("visual.deepstack_merger_list."):
            j, rest = name.split(".", 3)[2:]
            kind, suffix = rest.split(".", 1)
            tensor = {"norm": gguf.MODEL_TENSOR.V_DS_NORM, "linear_fc1": gguf.MODEL_TENSOR.V_DS_FC1,
                      "linear_fc2": gguf.MODEL_TENSOR.V_DS_FC2}[kind]
            new = [names[tensor].format(bid=vc["deepstack_visual_indexes"][int(j)]) + "." + suffix]
        elif name.startswith("visual.merger."):
            kind, suffix = name.split(".", 2)[2].split(".", 1)
            new = [(names[gguf.MODEL_TENSOR.V_POST_NORM] if kind == "norm" else
                    names[gguf.MODEL_TENSOR.V_MMPROJ].format(bid={"linear_fc1": 0, "linear_fc2": 2}[kind])) + "." + suffix]
        elif name == "visual.patch_embed.proj.weight":  # the Conv3d's temporal halves
            base = names[gguf.MODEL_TENSOR.V_ENC_EMBD_PATCH]
            out[base + ".weight"] = ("F16", data[:, :, 0].astype(np.float16))  # tensor_force_quant: F16 at f16
            out[base + ".weight.1"] = ("F16", data[:, :, 1].astype(np.float16))
            continue
        elif name == "visual.patch_embed.proj.bias":
            new = [names[gguf.MODEL_TENSOR.V_ENC_EMBD_PATCH] + ".bias"]
        else:
            new = [tmap.get_name(name, try_suffixes=(".weight", ".bias"))]
        assert new[0] is not None, name
        always_f32 = new[0].startswith(names[gguf.MODEL_TENSOR.V_ENC_EMBD_POS])
        qtype = "F32" if data.ndim <= 1 or always_f32 else "F16"
        out[new[0]] = (qtype, data.astype(np.float16 if qtype == "F16" else np.float32))
    return out


def expected_mmproj_keys(folder) -> dict:
    cfg = json.loads((folder / "config.json").read_text())
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    vc, tc = cfg["vision_config"], cfg["text_config"]
    V = gguf.Keys.ClipVision
    return {"general.architecture": "clip", "general.type": "mmproj", "general.file_type": 1,
            "general.quantization_version": 2, "general.name": folder.name,
            gguf.Keys.Clip.HAS_VISION_ENCODER: True, V.PROJECTION_DIM: tc["hidden_size"],
            V.IMAGE_SIZE: int(vc["num_position_embeddings"] ** 0.5 * vc["patch_size"]), V.PATCH_SIZE: vc["patch_size"],
            V.EMBEDDING_LENGTH: vc["hidden_size"], V.FEED_FORWARD_LENGTH: vc["intermediate_size"],
            V.BLOCK_COUNT: vc["depth"], V.Attention.HEAD_COUNT: vc["num_heads"], V.IMAGE_MEAN: pre["image_mean"],
            V.IMAGE_STD: pre["image_std"], gguf.Keys.Clip.PROJECTOR_TYPE: gguf.VisionProjectorType.QWEN3VL,
            V.USE_GELU: True, V.SPATIAL_MERGE_SIZE: vc["spatial_merge_size"],
            V.Attention.LAYERNORM_EPS: tc.get("rms_norm_eps", 1e-6),
            V.IS_DEEPSTACK_LAYERS: [i in vc["deepstack_visual_indexes"] for i in range(vc["depth"])]}


def experts(tc: dict) -> int:
    return tc.get("num_experts", tc.get("num_local_experts"))  # the hub's name, transformers 5's


def hub_experts(folder) -> dict[str, np.ndarray]:
    """The MoE folder's stacked experts in the hub's [E, in, out] layout (gate_up_proj [E, C, 2F],
    down_proj [E, F, C]), which convert_hf_to_gguf.py's Qwen3VLMoeTextModel takes; transformers 5
    saved them [E, out, in]."""
    tc = json.loads((folder / "config.json").read_text())["text_config"]
    if arch_of(folder) != gguf.MODEL_ARCH.QWEN3VLMOE:
        return {}
    E, C, F = experts(tc), tc["hidden_size"], tc["moe_intermediate_size"]
    weights = ModelFolder(folder).open_weights()
    out = {}
    for name in weights.keys():  # noqa: SIM118
        if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            data = np.asarray(weights.get(name), np.float32)
            assert data.shape == ((E, 2 * F, C) if name.endswith("gate_up_proj") else (E, C, F)), name
            out[name] = np.ascontiguousarray(np.swapaxes(data, 1, 2))
    return out


def expected_expert_tensors(folder) -> dict[str, np.ndarray]:
    """GGUF name -> values of the routers and experts as Qwen3VLMoeTextModel.modify_tensors writes
    them: gate_up_proj [E, C, 2F] split on its last axis, each half and down_proj permuted (0, 2, 1)
    (then gguf-py's reversed ne: gate / up {C, F, E}, down {F, C, E}); the router through Qwen3-MoE's map."""
    names = gguf.TENSOR_NAMES
    weights = ModelFolder(folder).open_weights()
    out = {}
    for name, data in hub_experts(folder).items():
        bid = int(name.split(".")[3])
        if name.endswith("gate_up_proj"):
            f = data.shape[-1] // 2
            out[names[gguf.MODEL_TENSOR.FFN_GATE_EXP].format(bid=bid) + ".weight"] = data[..., :f].transpose(0, 2, 1)
            out[names[gguf.MODEL_TENSOR.FFN_UP_EXP].format(bid=bid) + ".weight"] = data[..., f:].transpose(0, 2, 1)
        else:
            out[names[gguf.MODEL_TENSOR.FFN_DOWN_EXP].format(bid=bid) + ".weight"] = data.transpose(0, 2, 1)
    for name in weights.keys():  # noqa: SIM118
        if name.endswith(".mlp.gate.weight"):
            bid = int(name.split(".")[3])
            out[names[gguf.MODEL_TENSOR.FFN_GATE_INP].format(bid=bid) + ".weight"] = np.asarray(weights.get(name),
                                                                                                 np.float32)
    return out


def _same(got, want, key):
    if isinstance(want, float) or (isinstance(want, list) and isinstance(want[0], float)):
        np.testing.assert_array_equal(np.float32(got), np.float32(want), err_msg=key)
    else:
        assert got == want, key


def test_quantize_writes_the_mmproj_llama_cpp_writes(folder, files):
    r, fields = _fields(files[1])
    want = expected_mmproj_keys(folder)
    assert set(fields) == set(want)
    for k, v in want.items():
        _same(fields[k], v, k)
    assert r.fields[gguf.Keys.ClipVision.IS_DEEPSTACK_LAYERS].types == [gguf.GGUFValueType.ARRAY,
                                                                         gguf.GGUFValueType.BOOL]
    tensors = expected_mmproj_tensors(folder)
    assert sorted(t.name for t in r.tensors) == sorted(tensors)
    for t in r.tensors:
        qtype, values = tensors[t.name]
        assert t.tensor_type.name == qtype, t.name
        np.testing.assert_array_equal(np.asarray(t.data).reshape(values.shape), values, err_msg=t.name)
    by_name = {t.name: t for t in r.tensors}
    vc = json.loads((folder / "config.json").read_text())["vision_config"]
    C, P = vc["hidden_size"], vc["patch_size"]
    assert list(by_name["v.patch_embd.weight.1"].shape) == [P, P, 3, C]  # ggml's conv2d kernel, ne order
    assert list(by_name["v.blk.0.attn_qkv.weight"].shape) == [C, 3 * C]  # fused, as clip.cpp's views read it
    assert list(by_name["v.deepstack.2.norm.weight"].shape) == [4 * C]  # after the 2 x 2 merge


def test_quantize_writes_the_text_gguf_llama_cpp_writes(folder, files):
    cfg = json.loads((folder / "config.json").read_text())
    tc, vc = cfg["text_config"], cfg["vision_config"]
    arch = arch_of(folder)
    ARCH = gguf.MODEL_ARCH_NAMES[arch]
    r, fields = _fields(files[0])
    assert fields["general.architecture"] == ARCH
    sections = gguf.Keys.Rope.DIMENSION_SECTIONS.format(arch=ARCH)
    assert fields[sections] == [*tc["rope_parameters"]["mrope_section"], 0]
    assert r.fields[sections].types == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32]  # gguf-py's add_array
    assert fields[gguf.Keys.LLM.NUM_DEEPSTACK_LAYERS.format(arch=ARCH)] == len(vc["deepstack_visual_indexes"])
    assert fields[gguf.Keys.Rope.FREQ_BASE.format(arch=ARCH)] == tc["rope_parameters"]["rope_theta"]
    assert fields[gguf.Keys.LLM.EMBEDDING_LENGTH.format(arch=ARCH)] == tc["hidden_size"]  # not x (1 + deepstack)
    allowed = {gguf.TENSOR_NAMES[t].format(bid=i) + suffix for t in gguf.MODEL_TENSORS[arch]
               for i in range(tc["num_hidden_layers"]) for suffix in (".weight",)}
    names = {t.name for t in r.tensors}
    assert names <= allowed and "output.weight" in names  # untied
    # per layer: attention norm, q / k / v / o, q / k norms, ffn norm; the MLP's three, or the router and three experts
    assert len(names) == 3 + (12 if arch == gguf.MODEL_ARCH.QWEN3VLMOE else 11) * tc["num_hidden_layers"]
    if arch == gguf.MODEL_ARCH.QWEN3VLMOE:
        L = gguf.Keys.LLM
        assert {k: fields[k.format(arch=ARCH)] for k in (L.EXPERT_COUNT, L.EXPERT_USED_COUNT,
                                                         L.EXPERT_FEED_FORWARD_LENGTH)} == \
            {L.EXPERT_COUNT: experts(tc), L.EXPERT_USED_COUNT: tc["num_experts_per_tok"],
             L.EXPERT_FEED_FORWARD_LENGTH: tc["moe_intermediate_size"]}
        by_name = {t.name: t for t in r.tensors}
        for name, values in expected_expert_tensors(folder).items():
            t = by_name[name]
            assert t.tensor_type.name == "F32" and list(t.shape) == list(values.shape[::-1]), name
            np.testing.assert_array_equal(np.asarray(t.data).reshape(values.shape), values, err_msg=name)
    tokens = fields["tokenizer.ggml.tokens"]
    for key in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
        assert tokens.index({"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                             "vision_start_token_id": "<|vision_start|>",
                             "vision_end_token_id": "<|vision_end|>"}[key]) == cfg[key]


def test_a_transformers4_checkpoint_writes_the_same_files(folder, files, tmp_path):
    # transformers 4.5x's layout: the tower under visual.* rather than model.visual.*, and the MoE's
    # stacked experts [E, in, out] (the hub's files).
    import shutil

    from safetensors.numpy import load_file, save_file

    other = tmp_path / folder.name
    shutil.copytree(folder, other)
    (st,) = other.glob("*.safetensors")
    hub = hub_experts(folder)
    save_file({k.removeprefix("model.") if k.startswith("model.visual.") else k: hub.get(k, v)
               for k, v in load_file(st).items()}, st, metadata={"format": "pt"})
    out = quantize_to_gguf(other, tmp_path / "tiny.gguf", "F32")
    assert out.read_bytes() == files[0].read_bytes()
    assert mmproj_path(out).read_bytes() == files[1].read_bytes()


# ---- reading the pair ------------------------------------------------------------------------------------

def _prompts(folder):
    """qwen3_vl_prompts' two image grids and three-frame video, with the chat folder's token ids."""
    cfg = json.loads((folder / "config.json").read_text())
    ids = {90: cfg["image_token_id"], 91: cfg["video_token_id"], 92: cfg["vision_start_token_id"],
           93: cfg["vision_end_token_id"]}
    (img, images), (vid, video) = qwen3_vl_prompts(seed=3)
    return [ids.get(i, i) for i in img], images, [ids.get(i, i) for i in vid], video


def test_the_pair_gives_transformers_logits_on_images_and_video(folder, files, hf):
    text, vision = files
    ours = load_model(str(text), mmproj=str(vision))
    assert ours.spec.vision.tower == load_model(str(folder)).spec.vision.tower
    img, images, vid, video = _prompts(folder)
    np.testing.assert_allclose(ours.forward(img, images=images), qwen3_vl_hf_logits(hf, img, images=images), atol=1e-4,
                               rtol=0)
    np.testing.assert_allclose(ours.forward(vid, videos=video), qwen3_vl_hf_logits(hf, vid, videos=video),
                               atol=1e-4, rtol=0)


def test_the_text_gguf_alone_is_the_language_model(family, files, hf):
    ours = load_model(str(files[0]))
    assert ours.spec.vision is None and ours.config["model_type"] == f"{family}_text"
    ids = [3, 17, 5, 60, 2, 44, 8, 1, 70, 12]
    np.testing.assert_allclose(ours.forward(ids), qwen3_vl_hf_logits(hf, ids), atol=1e-4, rtol=0)


def test_a_quantized_text_gguf_keeps_its_blocks_and_the_tower_from_the_mmproj(folder, tmp_path):
    text = quantize_to_gguf(folder, tmp_path / "q8.gguf", "Q8_0")
    ref, ours = load_model(str(folder)), load_model(str(text), mmproj=str(mmproj_path(text)), quantized=True)
    assert ours.quant and not [n for n in ours.quant if n.startswith("visual")]
    _, images, _, _ = _prompts(folder)
    (rows, deep), (want, want_deep) = ours.encode_images(*images), ref.encode_images(*images)
    np.testing.assert_array_equal(rows, want)
    assert len(deep) == 2 and all(np.array_equal(a, b) for a, b in zip(deep, want_deep))


# ---- serving the pair ------------------------------------------------------------------------------------

def test_the_pair_serves_images_and_videos_as_the_folder(folder, files):
    from surogate.io.videos import Video

    text, vision = files
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)
    messages = [{"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "image", "image": image(7)},
                                             {"type": "text", "text": "please"}]}]
    chat, images = template_messages(messages)
    clip = Video(tuple(image(20 + i, (30, 20)) for i in range(4)), (0, 1, 2, 3), 2.0)
    clip_chat = [{"role": "user", "content": [{"type": "text", "text": "What happens?"}, {"type": "video"}]}]
    answers = []
    for source, kw in ((str(folder), {}), (str(text), {"mmproj": str(vision)})):
        m = launch(source, kv_cache_tokens=1024, **kw)
        try:
            llm = m.llm()
            got = []
            for conv, media in ((chat, {"images": images}), (clip_chat, {"videos": [clip]})):
                out = llm.chat(conv, greedy, **media).result(timeout=120)[0]
                got.append((llm.render(conv, **media).token_ids, list(out.new_token_ids),
                            [t.logprob for t in out.logprobs]))
            other = llm.chat(chat, greedy, images=[image(8)]).result(timeout=120)[0]
            assert list(other.new_token_ids) != got[0][1] or [t.logprob for t in other.logprobs] != got[0][2]
            answers.append(got)
        finally:
            m.client.close()
    for (p0, a0, l0), (p1, a1, l1) in zip(*answers):
        assert p0 == p1 and a0 == a1
        np.testing.assert_allclose(l0, l1, rtol=1e-5, atol=1e-5)
    cfg = json.loads((folder / "config.json").read_text())
    assert answers[0][0][0].count(cfg["image_token_id"]) >= 8  # clip.cpp's least tokens per image
    assert answers[0][1][0].count(cfg["video_token_id"]) > 0


# ---- refusals --------------------------------------------------------------------------------------------

def test_mismatched_files_are_refused_naming_the_key(folder, files, tmp_path):
    text, vision = files
    ARCH = gguf.MODEL_ARCH_NAMES[arch_of(folder)]
    for changes, error, key in (({"clip__projector_type": "qwen2vl_merger"}, UnsupportedError, "clip.projector_type"),
                                ({"clip__vision__projection_dim": 128}, ConfigError, "clip.vision.projection_dim"),
                                ({"clip__vision__is_deepstack_layers": [True, False, False]}, ConfigError,
                                 f"{ARCH}.n_deepstack_layers")):
        other = copy_gguf(vision, tmp_path / "other.gguf", **changes)
        with pytest.raises(error, match=key):
            load_model(str(text), mmproj=str(other))
