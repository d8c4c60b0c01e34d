"""Model files in and out: safetensors, Hugging Face model folders, tokenizers and chat templates.

A leaf package: it imports nothing else from surogate but ``errors``, and never torch or
transformers (they are test-only references).
"""

from __future__ import annotations

from surogate.io.chat_template import ChatTemplate
from surogate.io.hf_folder import ModelFolder, resolve_model_path
from surogate.io.safetensors import (
    DTYPES,
    SafetensorsFile,
    ShardedCheckpoint,
    TensorInfo,
    open_safetensors,
    save_safetensors,
)
from surogate.io.tokenizer import Tokenizer

__all__ = [
    "DTYPES",
    "ChatTemplate",
    "ModelFolder",
    "SafetensorsFile",
    "ShardedCheckpoint",
    "TensorInfo",
    "Tokenizer",
    "open_safetensors",
    "resolve_model_path",
    "save_safetensors",
]
