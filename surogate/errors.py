"""Errors the user sees. Every failure says what went wrong, where, and what to do.

Native code raises these too: a C++ ``Status`` arrives as the subclass for its code, with the
message, the hint and the ``kernels_native/...:line`` it came from.
"""

from __future__ import annotations


class SurogateError(Exception):
    """Base class: ``message`` says what went wrong, ``hint`` what to do about it."""

    def __init__(self, message: str, hint: str | None = None, where: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.where = where

    def __str__(self) -> str:
        text = self.message
        if self.where:
            text += f" (at {self.where})"
        if self.hint:
            text += f"\nHINT: {self.hint}"
        return text


class InvalidArgumentError(SurogateError, ValueError):
    """A value the caller passed is not acceptable."""


class ShapeError(InvalidArgumentError):
    """Tensors whose shapes do not fit together."""


class DTypeError(InvalidArgumentError, TypeError):
    """No kernel for this dtype, or dtypes that do not match."""


class NotFoundError(SurogateError, LookupError):
    """An op, buffer, file or model that does not exist."""


class OutOfMemoryError(SurogateError, MemoryError):
    """A device or host allocation failed."""


class UnsupportedError(SurogateError):
    """A feature this build or machine does not have."""


class FileFormatError(SurogateError):
    """A file that is truncated, malformed or of an unsupported kind."""


class ConfigError(SurogateError):
    """A configuration key or value that is wrong; the message names the key path."""


class DeviceError(SurogateError):
    """A CUDA or driver failure."""


class NetworkError(SurogateError, ConnectionError):
    """A peer process of a collective group (a rank on another node) dropped its connection,
    timed out or sent what no rank sends."""


class InternalError(SurogateError):
    """A bug in surogate: please report it with the message."""


class NotBuiltYetError(SurogateError):
    """A command or feature the product will have but this version does not."""
