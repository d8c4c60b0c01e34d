"""Surogate: train and serve large language models on one native C++/CUDA engine.

Importing this package is cheap: it loads the native module's BLAS but neither the UI
(textual) nor the server (granian), and wandb only when a run asks for it.
"""

from __future__ import annotations

from surogate import _blas
from surogate.errors import SurogateError

__version__ = "0.1.0"

_blas.preload()


def load_model(path_or_id, device: str = "cpu", dtype: str = "float32", **kw):
    """Load a Hugging Face model folder (or cached hub id); see surogate.model.load_model."""
    from surogate.model import load_model as _load

    return _load(path_or_id, device=device, dtype=dtype, **kw)


__all__ = ["SurogateError", "__version__", "load_model"]
