"""Paths as the screens show them: relative to the current directory when inside it, ~/ under the
home folder, else absolute (short, and the same on every machine that has the same layout)."""

from __future__ import annotations

import os
from pathlib import Path


def short_path(path: str | os.PathLike) -> str:
    p = Path(path).expanduser()
    if not p.is_absolute():
        return str(p)
    for base, prefix in ((Path.cwd(), ""), (Path.home(), "~/")):
        try:
            rel = p.relative_to(base)
        except ValueError:
            continue
        text = str(rel)
        return prefix + text if text != "." else (prefix.rstrip("/") or ".")
    return str(p)
