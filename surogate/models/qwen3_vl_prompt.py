"""Qwen3-VL's served prompts: the text its images and videos expand to (Qwen3VLProcessor's rule),
their processors, and the EmbedSpans that carry each image's or video frame's rows, DeepStack rows
and MRoPE angles to the paged engine (dsl/nn_qwen3_vl.py's serving rows). The family file
(models/qwen3_vl.py) makes the positions (`rope_index`, `mrope_tables`) and runs the tower.
"""

from __future__ import annotations

import os

import numpy as np

from surogate.errors import ConfigError, InvalidArgumentError
from surogate.models.qwen3_vl_vision import VisionSpec


def processors(tower: VisionSpec, folder: str | None):
    """(QwenVLImageProcessor, QwenVLVideoProcessor) of a served model: a folder's
    preprocessor_config.json and video_preprocessor_config.json (each, without its file, the tower's
    patch sizes with transformers' defaults); for a GGUF model ``folder`` is its mmproj file, whose
    processors llama.cpp's clip.cpp implies (models/qwen3_vl_gguf.py `mmproj_processor_configs`).
    The processors must cut the tower's patches."""
    from surogate.io.image_processing import IMAGE_CONFIG, VIDEO_CONFIG, QwenVLImageProcessor, QwenVLVideoProcessor

    sizes = {"patch_size": tower.patch_size, "merge_size": tower.spatial_merge_size,
             "temporal_patch_size": tower.temporal_patch_size}
    if folder is not None and os.path.isfile(folder):
        from surogate.io.gguf import GGUFFile
        from surogate.models.qwen3_vl_gguf import mmproj_processor_configs

        image_cfg, video_cfg = mmproj_processor_configs(GGUFFile(folder))
        image = QwenVLImageProcessor.from_config(image_cfg, source=str(folder))
        video = QwenVLVideoProcessor.from_config(video_cfg, source=str(folder))
    else:
        has = folder is not None and os.path.isfile(os.path.join(folder, IMAGE_CONFIG))
        image = QwenVLImageProcessor.from_folder(folder) if has else QwenVLImageProcessor.from_config(sizes)
        has = folder is not None and os.path.isfile(os.path.join(folder, VIDEO_CONFIG))
        video = QwenVLVideoProcessor.from_folder(folder) if has else QwenVLVideoProcessor.from_config(sizes)
    for name, p in ((IMAGE_CONFIG, image), (VIDEO_CONFIG, video)):
        if (p.patch_size, p.merge_size, p.temporal_patch_size) != tuple(sizes.values()):
            raise ConfigError(f"{name}: patch_size {p.patch_size}, merge_size {p.merge_size}, temporal_patch_size "
                              f"{p.temporal_patch_size} differ from config.json's vision_config "
                              f"({', '.join(map(str, sizes.values()))})",
                              hint="the tower cuts the processor's patches; fix one of the files")
    return image, video


def serve_spans(token_ids, spec, images=((), (), ()), videos=((), (), ())) -> list:
    """The EmbedSpans of a prompt's images and video frames for the paged engine (dsl/nn_qwen3_vl.py's
    serving rows): ``images`` / ``videos`` = (grids_thw, rows, keys), one entry each, rows [t h w /
    merge^2, C (1 + deepstack)] (`encode_visual`'s merged rows and DeepStack rows side by side). Each
    run of pad tokens (an image; a video frame: its timestamp is text between frames) takes its rows
    [merged | DeepStack j ... | cos | sin], the tokens' MRoPE angles from `rope_index` over the
    whole prompt (the run's place in it: the prefix cache keys a block by its chain of tokens and
    spans, so equal keys see equal positions), and shifts the positions after it by max(h, w) /
    merge - its tokens (HF's rope_deltas, summed over runs). A video frame's key is the video's
    hashed with the frame index."""
    import hashlib

    from surogate.models.qwen3_vl import mrope_tables, rope_index
    from surogate.serve.multimodal import image_runs
    from surogate.serve.types import EmbedSpan

    vs = spec.vision
    m = vs.tower.spatial_merge_size
    ids = np.asarray(token_ids, np.int64)
    grids = {}
    views = []  # (token id, [(grid row of one run, rows, key)]) for images, then video frames
    for token, (g, rows, keys), what in ((vs.image_token_id, images, "image"), (vs.video_token_id, videos, "video")):
        g = np.asarray(g, np.int64).reshape(-1, 3)
        grids[what] = g if len(g) else None
        runs = []
        for (t, h, w), r, key in zip(g.tolist(), rows, keys):
            n = h * w // (m * m)
            if len(r) != t * n:
                raise InvalidArgumentError(f"a {what}'s rows {np.shape(r)} do not fit its grid {(t, h, w)}",
                                           hint="pass encode_visual's rows for the grid")
            runs += [((1, h, w), r[f * n:(f + 1) * n],
                      key if t == 1 else hashlib.sha256(key + f.to_bytes(4, "little")).digest()) for f in range(t)]
        got = image_runs(ids, token)
        want = [h * w // (m * m) for (_, h, w), _, _ in runs]
        if [n for _, n in got] != want:
            raise InvalidArgumentError(f"the prompt's {what} tokens (id {token}) come in runs of {[n for _, n in got]}; "
                                       f"its {what}s need runs of {want}",
                                       hint="render the messages with the model's chat template (LLM.render), which "
                                            f"expands each {what}; do not write the {what} token in the text")
        views += [(start, n, run) for (start, n), run in zip(got, runs)]
    pos3 = rope_index(ids, np.array([0, len(ids)]), grids["image"], grids["video"], vs)
    cos, sin = mrope_tables(pos3, spec.head_dim, vs)
    out = []
    for start, n, ((_, h, w), r, key) in sorted(views, key=lambda v: v[0]):
        payload = np.concatenate([np.asarray(r, np.float32), cos[start:start + n], sin[start:start + n]], axis=1)
        out.append(EmbedSpan(start, np.ascontiguousarray(payload), key, False, position_shift=max(h, w) // m - n))
    return out


def image_prompt(spec, tokenizer, folder: str | None):
    """Qwen3VLProcessor's text rule: the template writes <|vision_start|><|image_pad|><|vision_end|>
    per image and the processor repeats <|image_pad|> grid_t grid_h grid_w / merge^2 times (the grid
    of the image as QwenVLImageProcessor resizes it: `processors`); the tokens attend causally; each
    image's rows carry its DeepStack rows and MRoPE angles (`serve_spans`). Videos (``video``, when the tokenizer has
    <|video_pad|>): the template writes <|vision_start|><|video_pad|><|vision_end|> per video part
    and, as Qwen3VLProcessor in transformers 4.57 and vLLM expand it, that whole placeholder becomes
    ``<t seconds><|vision_start|><|video_pad|> x h w / merge^2<|vision_end|>`` per temporal patch
    (its frames' mean time), the clip sampled and resized by QwenVLVideoProcessor (`processors`).
    ``folder``: the model's folder, or with a GGUF model llama.cpp's mmproj file."""
    from surogate.io.image_processing import QwenImages, to_rgb
    from surogate.models.family import ImagePrompt, VideoPrompt

    vs = spec.vision
    names = {}
    for what, index in (("vision_start", vs.vision_start_token_id), ("image", vs.image_token_id),
                        ("vision_end", vs.vision_end_token_id)):
        token = tokenizer.id_to_token(index)
        if token is None:
            raise ConfigError(f"config.json: the {what} token (id {index}) is not in the tokenizer's vocabulary",
                              hint="serve the model's own tokenizer.json (Qwen3-VL's has <|vision_start|>, "
                                   "<|image_pad|> and <|vision_end|>)")
        names[what] = token
    t = vs.tower
    processor, vproc = processors(t, folder)

    def grid(image) -> tuple[int, int, int]:
        return processor.grid_thw(*to_rgb(image).shape[:2])

    def image_text(n: int) -> str:  # an image of n merged tokens
        return f"{names['vision_start']}{names['image'] * n}{names['vision_end']}"

    def encode(encode_images, batches) -> list[np.ndarray]:  # the images' patch rows and grids in one call
        grids = np.concatenate([b.image_grid_thw for b in batches])
        merged, deep = encode_images(np.concatenate([b.pixel_values for b in batches]), grids)
        rows = np.concatenate([merged, *deep], axis=1)
        bounds = np.cumsum([0, *(grids.prod(axis=1) // t.merge_unit)])
        return [rows[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    video = None
    video_pad = tokenizer.id_to_token(vs.video_token_id)
    if video_pad is not None:
        def video_grid(v) -> tuple[int, int, int]:
            width, height = v.size
            return vproc.grid_thw(len(v.frames), height, width)

        def video_text(v) -> str:
            _, h, w = video_grid(v)
            frame = f"{names['vision_start']}{video_pad * (h * w // t.merge_unit)}{names['vision_end']}"
            return "".join(f"<{s:.1f} seconds>{frame}" for s in vproc.timestamps(v.frame_indices, v.fps))

        def video_batch(v) -> QwenImages:
            out = vproc(list(v.frames), fps=v.fps, sample=False)
            return QwenImages(out.pixel_values_videos, out.video_grid_thw)

        video = VideoPrompt(placeholder=f"{names['vision_start']}{video_pad}{names['vision_end']}",
                            text_of=video_text, batch=video_batch, fps=vproc.fps,
                            sample=lambda total, fps: vproc.sample_frame_indices(total, fps))

    def spans(token_ids, images, keys, rows, videos=(), video_keys=(), video_rows=()) -> list:
        return serve_spans(token_ids, spec, images=([grid(im) for im in images], rows, keys),
                           videos=([video_grid(v) for v in videos], video_rows, video_keys))

    return ImagePrompt(placeholder=f"{names['vision_start']}{names['image']}{names['vision_end']}",
                       image_text=image_text, processor=processor, image_token_id=vs.image_token_id,
                       tokens_per_view=0, bidirectional=False,
                       text_of=lambda image: image_text(processor.num_image_tokens(*to_rgb(image).shape[:2])),
                       encode=encode, spans=spans, video=video,
                       image_tokens=lambda image: processor.num_image_tokens(*to_rgb(image).shape[:2]))
