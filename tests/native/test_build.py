"""How the native module is linked: facts that, when wrong, crash at import time elsewhere."""

import shutil
import subprocess

import pytest

from surogate import _native


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs readelf")
def test_libstdcxx_is_linked_dynamically():
    out = subprocess.run(["readelf", "-d", _native.__file__], capture_output=True, text=True).stdout
    needed = [line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]
    # A static libstdc++ copy beside numpy's / torch's shared one breaks iostreams (seen on a GPU box).
    assert "libstdc++.so.6" in needed, needed
    assert not any("cudart_static" in n for n in needed)


def test_error_messages_format_numbers():
    # str_cat (iostreams) runs in every error path; it must work after numpy and torch loaded.
    pytest.importorskip("torch")
    import numpy as np

    from surogate.errors import ShapeError

    with pytest.raises(ShapeError, match=r"\[2, 3\]"):
        _native.call_op("add", [np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)],
                        [np.ones((2, 3), np.float32)], {})
