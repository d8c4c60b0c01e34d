"""Load the CPU backend's OpenBLAS before the native module needs it.

The native module links ``libscipy_openblas.so`` from the ``scipy-openblas32`` wheel. Its
RPATH finds the library when both sit in one site-packages; loading it here by absolute path
also covers editable installs, virtual environments and development builds.
"""

from __future__ import annotations

import ctypes
import os


def preload() -> None:
    try:
        import scipy_openblas32
    except ImportError:  # the native import will then say which library is missing
        return
    path = os.path.join(scipy_openblas32.get_lib_dir(), "libscipy_openblas.so")
    if os.path.exists(path):
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
