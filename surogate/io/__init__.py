"""Model files in and out: safetensors, Hugging Face model folders, GGUF files (read and write),
tokenizers and chat templates.

A leaf package: it imports nothing else from surogate but ``errors`` (and the native module, for
GGUF blocks), and never torch or transformers (they are test-only references). It knows no model
family: a family's GGUF parts (architecture name, tensor names, llama.cpp's row order, the HF
names its metadata maps to) are in its file in surogate/models/, which passes them in.
"""

from __future__ import annotations

from surogate.io.chat_template import ChatTemplate
from surogate.io.gguf import GGUFFile, GGUFTensor, is_gguf
from surogate.io.gguf_tokenizer import save_hf_tokenizer
from surogate.io.gguf_writer import QUANT_TYPES, write_gguf
from surogate.io.hf_folder import ModelFolder, resolve_model_path
from surogate.io.safetensors import (
    DTYPES,
    PendingTensor,
    SafetensorsFile,
    ShardedCheckpoint,
    TensorInfo,
    open_safetensors,
    save_safetensors,
    save_sharded_safetensors,
)
from surogate.io.tokenizer import Tokenizer

__all__ = [
    "DTYPES",
    "QUANT_TYPES",
    "ChatTemplate",
    "GGUFFile",
    "GGUFTensor",
    "ModelFolder",
    "PendingTensor",
    "SafetensorsFile",
    "ShardedCheckpoint",
    "TensorInfo",
    "Tokenizer",
    "is_gguf",
    "open_safetensors",
    "resolve_model_path",
    "save_hf_tokenizer",
    "save_safetensors",
    "save_sharded_safetensors",
    "write_gguf",
]
