"""Rewrite a GGUF file with gguf-py, some of its keys changed: the refusal tests' bad files."""

from __future__ import annotations

import gguf
import numpy as np


def copy_gguf(src, dst, **changes):
    """``src`` rewritten with gguf-py, the keys in ``changes`` (dots as __) set to new values."""
    r = gguf.GGUFReader(src)
    changes = {k.replace("__", "."): v for k, v in changes.items()}
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        value = changes.get(k, f.contents())
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, value, f.types[0], sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed([int(x) for x in t.shape])),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
