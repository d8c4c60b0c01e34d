"""Compile a DSL graph: lower to instructions, plan buffers by liveness, emit a native Program."""

from surogate.compile.executable import Executable, MemoryReport

__all__ = ["Executable", "MemoryReport"]
