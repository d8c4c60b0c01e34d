"""Optimizer offload (the original Surogate's ``offload_optimizer``): AdamW's state lives in host
memory and the step runs on the CPU backend, so a GPU holds only weights, gradients and
activations.

`HostAdamW` is `AdamW` with its step compiled into a CPU Program of its own instead of the
training Program's `optimizer` phase. That Program reads and writes the host arrays the training
Program's weights and gradient accumulators are bound to (and the moments, f32 masters and
8-bit scales, which never leave the host). One step:

1. gradients down: every accumulator is pulled from the device into its host array;
2. the step on the CPU: global norm, clipping, the multi-tensor `adamw` / `adamw8` (the same
   native kernels as a CPU run, so the numbers are those of the no-offload CPU step, and the
   CUDA optimizer is bit-identical to them), the host accumulators zeroed;
3. weights up: every trained parameter is pushed to its device tensor (which the evaluation
   Program and the model share);
4. the device accumulators zeroed by a small phase of the training Program (``zero_grads``).

What this first version does not do yet: the host arrays are ordinary (pageable) numpy memory,
not pinned, and the copies are synchronous after the backward pass, not streamed per layer on a
copy stream while the backward runs. On the CPU backend nothing is offloaded (everything is in
host memory already); the trainer then uses `AdamW` and says so.
"""

from __future__ import annotations

from surogate.compile import Executable
from surogate.dsl.graph import Graph, Value
from surogate.train.optimizer import PHASE, AdamW

ZERO_PHASE = "zero_grads"


class HostAdamW(AdamW):
    def _place(self, g: Graph, norm: Value) -> Executable:
        host = Executable(g, {}, "cpu", keep=[norm])
        host.lowered.phases = {PHASE: host.lowered.phases["forward"]}  # the whole Program is the step
        for n in self.names:  # the very host arrays the training Program pulls into / pushes from
            host.bind(n, self.exe.bound(n))
            host.bind("grad." + n, self.exe.bound("grad." + n))
        self._hp_used = True  # AdamW's step reads its hyper-parameters (Muon has no host step)
        for key, arr in (("optimizer.hp", self.hp_buf), *self._buffers()):
            host.bind(key, arr)
        zero = Graph(f"{self.exe.graph.name}.{ZERO_PHASE}")
        for n in self.names:
            b, gb = self.exe.buf(n), self.exe.buf("grad." + n)
            zero.node("fill", [], [zero.grad_buffer(zero.param(n, b.shape, b.dtype), gb.dtype)], value=0.0)
        self.exe.add_phase(ZERO_PHASE, zero)
        return host

    def apply(self, lr: float) -> float:
        for n in self.names:
            self.exe.pull("grad." + n)
        norm = super().apply(lr)
        for n in self.names:
            self.exe.push(n)
        self.exe.run(ZERO_PHASE)
        return norm
