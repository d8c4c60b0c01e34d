"""`surogate models`: which model families this version trains and serves."""

from __future__ import annotations

from surogate.cli.not_built import not_built


def models() -> None:
    """List supported model families and the models on this machine."""
    not_built("models", 'models: issue #10 default model')
