"""Compile a DSL graph: serving fusions (serving graphs only), lower to instructions, plan buffers
by liveness, emit a native Program."""

from surogate.compile.executable import Executable, MemoryReport
from surogate.compile.fuse import fuse_serving

__all__ = ["Executable", "MemoryReport", "fuse_serving"]
