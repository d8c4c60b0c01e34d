"""What a model family is: every part that differs between families, in one value.

A family file (llama.py, qwen3.py) builds one ``Family`` and the registry (registry.py) lists
it; loading, training, serving, export, ``surogate quantize``, the parser defaults, the bench
shapes and the parity tests all read a family from here and from nowhere else. README-dev.md
says how to add one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from surogate.dsl.nn import CausalLM, LoRAConfig, ModelSpec
from surogate.models.gguf_names import GGUFNameTable
from surogate.models.name_table import NameTable

if TYPE_CHECKING:
    from surogate.io.gguf import GGUFFile


@dataclass(frozen=True)
class GGUFArchitecture:
    """The family as llama.cpp knows it. The metadata functions say which ``{name}.*`` keys
    carry which HF config keys (io/gguf_config.py has llama.cpp's keys common to every
    architecture; a family with keys of its own wraps them)."""

    name: str                                        # general.architecture, llama.cpp's name
    tensors: Callable[[], GGUFNameTable]             # HF tensor names <-> GGUF names, q/k row order
    config_from_gguf: Callable[[GGUFFile], dict]     # GGUF metadata -> HF config.json keys (read)
    metadata: Callable[[dict, dict], dict]           # (HF config, our rope attrs) -> GGUF keys (quantize)
    rope_freqs: bool = False                         # Llama 3 rope scaling written as rope_freqs.weight
    # GGUF tensors made from the HF config rather than the checkpoint (llama.cpp's
    # generate_extra_tensors: Gemma 4's rope_freqs.weight), written F32 before the others.
    extra_tensors: Callable[[dict], dict[str, np.ndarray]] | None = None
    unsupported: str = ""                            # why this tree neither reads nor writes it yet (the GGUF tests skip it)
    mmproj: MmprojArchitecture | None = None         # the vision tower as llama.cpp's separate mmproj file


@dataclass(frozen=True)
class MmprojArchitecture:
    """The vision tower and projector as llama.cpp writes them beside the text GGUF
    (convert_hf_to_gguf.py --mmproj: general.architecture "clip", clip.* keys, v.* / mm.* tensors)."""

    tensors: Callable[[dict], GGUFNameTable]         # (HF config) -> HF tensor names <-> mmproj GGUF names
    checkpoint_name: Callable[[str], str]            # a checkpoint's tensor name -> the tables' name (or itself)
    text_config: Callable[[dict], dict]              # the HF config -> its language model's, as a text config
    metadata: Callable[[dict, object], dict]         # (HF config, ModelFolder) -> clip.* keys (quantize)
    config: Callable[[dict, GGUFFile, object], dict]  # (text config from the GGUF, mmproj file, tokenizer) -> config


@dataclass(frozen=True)
class ChatDefaults:
    """What serving assumes of the family's chat template where the template does not show it
    (surogate/serve/parsers/registry.py reads the template first: ``<tool_call>``, ``<think>``,
    Llama 3's headers). Names are vLLM's parser names."""

    reasoning_parser: str | None = None  # the name given when the template writes <think>
    tool_parser: str | None = None       # for a template that takes tools without showing their format
    model_types: tuple[str, ...] = ()    # config.json model_type prefixes these defaults cover


@dataclass(frozen=True)
class VideoPrompt:
    """What a family's videos need in a served prompt (a video: surogate.io.videos.Video, its
    sampled frames): the chat template writes ``placeholder`` once per video part; ``text_of(video)``
    replaces it (Qwen3-VL: each temporal patch's ``<t seconds>`` and its run of video tokens);
    ``batch(video)`` is the processor's output in the form ImagePrompt.encode takes (pixel rows and
    a grid, encoded in the same tower calls as images); ``sample(total, fps)`` the frame indices of a
    clip the processor keeps, and ``fps`` the rate a frame list without one is taken at."""

    placeholder: str
    text_of: Callable[[object], str]
    batch: Callable[[object], object]
    sample: Callable[[int, float], Sequence[int]]
    fps: float


@dataclass(frozen=True)
class ImagePrompt:
    """What a family's images need in a served prompt (surogate/serve/multimodal.py runs it): the
    chat template writes ``placeholder`` once per image; ``image_text(num_crops)`` is the text that
    replaces it (the processor's expansion: the image tokens of the image and of its ``num_crops``
    crops), re-tokenized so the ids equal the HF processor's; ``processor(images)`` gives
    ``surogate.io.image_processing.ImageBatch``; every run of ``tokens_per_view`` ``image_token_id``
    tokens takes one view's rows (``Model.encode_images``), attending both ways within the run when
    ``bidirectional``."""

    placeholder: str
    image_text: Callable[[int], str]
    processor: Callable
    image_token_id: int
    tokens_per_view: int
    bidirectional: bool
    num_crops: Callable[[object], int] = lambda image: 0  # the crops the processor cuts from an image
    # A family whose image text, rows or spans depend on each image's size (Qwen3-VL: its grid):
    # ``text_of(image)`` replaces image_text(num_crops(image)); ``encode(encode_images, batches)``
    # gives each image's rows from the processor's outputs (one per image), in one encode_images
    # call (default: serve.multimodal's, over the views' pixel values stacked);
    # ``spans(token_ids, images, keys, rows)`` the prompt's EmbedSpans (default: one per run of
    # tokens_per_view image tokens, a view's rows each); with videos also ``videos=, video_keys=,
    # video_rows=``.
    text_of: Callable[[object], str] | None = None
    encode: Callable[[Callable, object], np.ndarray] | None = None
    spans: Callable[..., list] | None = None
    video: VideoPrompt | None = None  # None: the family's served prompts take no videos
    # Training (train/data): such a family's count of image tokens for an image; its text is then
    # image_text(count), and the micro-batch's rows are the tokens' (train/qwen3_vl_feed.py).
    image_tokens: Callable[[object], int] | None = None


@dataclass(frozen=True)
class TinyModel:
    """A tiny random checkpoint of the family, for tests (tests/sgtest/tiny_models.py builds it
    with transformers): ``config`` holds HF config keys; the vocabulary and the special token ids
    come from a tokenizer of style ``tokenizer`` (that file's STYLES). ``variants``: named
    overrides of ``config`` that the parity tests run too (odd sizes, GQA ratios, tying, rope)."""

    tokenizer: str
    config: Mapping[str, object]
    bos_token: str | None
    eos_token: str
    vocab_multiple: int = 1  # the vocabulary padded past the tokenizer's, as Qwen3's is
    variants: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    # Overrides for the GGUF tests: rows of 256 values, so that every K type applies (and what
    # transformers' GGUF reader, the reference, assumes of the family).
    gguf: Mapping[str, object] = field(default_factory=lambda: {"hidden_size": 256, "intermediate_size": 512})


@dataclass(frozen=True)
class VisionHooks:
    """A vision family's part of `Model.encode_images` and of its image feed (`Model.forward`,
    `loss` and `loss_and_grads` with ``images=`` / ``videos=``).

    ``encode(model, pixel_values, grid_thw, hidden, pooled, projector)``: the tower's rows
    (``projector``: a served adapter's projector, Model.projectors' key, or None: the model's).
    ``inputs(model, ids, pos, cu, images, videos)``: None for a prompt run as plain text (no
    images, no videos), else ``(images, ids, pos, feed)``: the ``images`` key of
    `Model.executable`, the token ids and positions to feed (pos None: the graph reads rope
    tables instead), and the graph's other inputs by name."""

    encode: Callable[..., object]
    inputs: Callable[..., tuple | None]


@dataclass(frozen=True)
class Family:
    name: str                                     # ours: ModelSpec.family, bench shapes, test ids
    hf_architectures: tuple[str, ...]             # config.json "architectures"; the first is the transformers class
    model_types: tuple[str, ...]                  # config.json "model_type" (a config without architectures)
    spec_from_config: Callable[[dict], ModelSpec]  # HF config -> the architecture facts
    architecture: Callable[[ModelSpec], CausalLM]  # the module tree whose build() traces every graph
    name_table: Callable[[], NameTable]           # our parameters <-> HF checkpoint tensors
    gguf: GGUFArchitecture
    chat: ChatDefaults
    bench_shapes: Mapping[str, dict]              # named ModelSpec fields (less family) for `surogate bench`
    tiny: TinyModel
    # peft's module names a LoRA adapter targets by default (the HF names of the projections).
    lora_targets: tuple[str, ...] = LoRAConfig.targets
    # HF config keys a bench shape needs beyond bench/shapes.py's common ones (a hybrid's layers).
    bench_hf_config: Callable[[ModelSpec], dict] | None = None
    # The names a checkpoint may give a name-table tensor, first found wins (Gemma 3 with images:
    # its language model under language_model.model.* or model.language_model.*); None: the table's.
    checkpoint_aliases: Callable[[str], tuple[str, ...]] | None = None
    # (spec, tokenizer, model folder or None) -> ImagePrompt, for a spec with images (ModelSpec.vision).
    image_prompt: Callable[[ModelSpec, object, str | None], ImagePrompt] | None = None
    # How a Model of this family runs its vision tower and feeds its rows (surogate/model.py calls
    # these for a spec with ModelSpec.vision).
    vision: VisionHooks | None = None
    # A regex over HF tensor names: the Linear weights a block-FP8 export quantizes (`surogate
    # quantize --type FP8`, the layout of the family's official *-FP8 releases; train/fp8_export.py);
    # every other 2-D tensor must be an embedding, lm_head or a module of fp8_kept. None: not
    # written as FP8.
    fp8_linears: str | None = None
    # A regex over HF module names (a tensor's name less its last part): what the releases keep
    # unquantized and list in quantization_config.modules_to_not_convert (after lm_head): a MoE's
    # routers and norms, a vision tower. None: no list (the dense releases write none).
    fp8_kept: str | None = None

    @property
    def hf_architecture(self) -> str:
        return self.hf_architectures[0]
