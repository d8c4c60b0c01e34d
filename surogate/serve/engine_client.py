"""EngineClient: the Python handle on one model's native engine.

``submit`` queues a request and returns its id; ``stream(id)`` is an async iterator of its
``RequestOutput``s (``wait(id)`` blocks for all of them instead); ``generate`` does both and aborts
the request if the consumer goes away (client disconnect -> KV blocks freed). Each submitted
request is read to its end once, by one of them. A poller thread waits on the native output
channel with the GIL released and hands each output to its request's stream.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import threading
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

from surogate import _native
from surogate.errors import InvalidArgumentError, NotFoundError
from surogate.serve.types import EngineConfig, EngineStats, RequestOutput, SamplingParams

_POLL_SECONDS = 0.05
# Clients still open at exit are closed before the interpreter goes away: their engine thread may
# be about to call a Python runner, which must not happen during finalization.
_OPEN_CLIENTS: weakref.WeakSet[EngineClient] = weakref.WeakSet()


@atexit.register
def _close_open_clients() -> None:
    for client in list(_OPEN_CLIENTS):
        client.close()


def _resolve(futures: list[asyncio.Future]) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_result(None)


class _Stream:
    """One request's outputs, for one consumer: async (``get``) or blocking (``get_sync``)."""

    def __init__(self) -> None:
        self._items: collections.deque[RequestOutput] = collections.deque()
        self._cond = threading.Condition()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None

    def put(self, out: RequestOutput) -> tuple[asyncio.AbstractEventLoop, asyncio.Future] | None:
        """Queue an output; returns the async consumer's (loop, future) to wake, if one waits
        (the caller wakes each loop once for a whole batch of outputs)."""
        with self._cond:
            self._items.append(out)
            self._cond.notify_all()
            waiter, self._waiter = self._waiter, None
        return waiter

    async def get(self) -> RequestOutput:
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._items:
                    return self._items.popleft()
                fut = loop.create_future()
                self._waiter = (loop, fut)
            await fut

    def get_sync(self, timeout: float | None) -> RequestOutput:
        with self._cond:
            if not self._cond.wait_for(lambda: self._items, timeout):
                raise TimeoutError(f"no engine output within {timeout} s")
            return self._items.popleft()


class EngineClient:
    """Drives a native engine over ``runner``: a ``_native.serve.ModelRunner``, an object that
    holds one as ``.native`` (surogate.serve.model_runner.ProgramRunner), or any object with
    ``vocab_size`` and ``run(step: StepInput) -> float32 array [len(step.logits_rows), V]``."""

    def __init__(self, runner: Any, config: EngineConfig) -> None:
        runner = getattr(runner, "native", runner)
        if not isinstance(runner, _native.serve.ModelRunner):
            if not (hasattr(runner, "run") and hasattr(runner, "vocab_size")):
                raise InvalidArgumentError(
                    f"runner {type(runner).__name__} is not a model runner",
                    hint="pass a _native.serve.ModelRunner or an object with vocab_size and run(step)",
                )
            runner = _native.serve.PyModelRunner(runner.run, int(runner.vocab_size))
        self._engine = _native.serve.Engine(runner, config)
        self._streams: dict[int, _Stream] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._engine.start()
        self._poller = threading.Thread(target=self._poll_loop, name="surogate-engine-poller", daemon=True)
        self._poller.start()
        _OPEN_CLIENTS.add(self)

    @property
    def vocab_size(self) -> int:
        return self._engine.vocab_size

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None, adapter: int | None = None
    ) -> int:
        """Queue a request; returns its id. Bad input raises InvalidArgumentError naming the field."""
        with self._lock:  # the poller dispatches under this lock: the stream exists before any output
            if self._closed:
                raise InvalidArgumentError("the engine client is closed", hint="create a new EngineClient")
            request_id = self._engine.submit(prompt_ids, params or SamplingParams(), -1 if adapter is None else adapter)
            self._streams[request_id] = _Stream()
        return request_id

    async def stream(self, request_id: int) -> AsyncIterator[RequestOutput]:
        """The request's outputs as they come, the last one with ``finish_reason`` set."""
        stream = self._stream(request_id)
        while True:
            out = await stream.get()
            if out.finished:
                self._forget(request_id)
            yield out
            if out.finished:
                return

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None, adapter: int | None = None
    ) -> AsyncIterator[RequestOutput]:
        """submit + stream; leaving the loop early (or cancellation) aborts the request."""
        request_id = self.submit(prompt_ids, params, adapter)
        finished = False
        try:
            async for out in self.stream(request_id):
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.abort(request_id)
                self._forget(request_id)  # nobody reads the "abort" output

    def wait(self, request_id: int, timeout: float | None = None) -> list[RequestOutput]:
        """Block until the request finishes; all its outputs, in order."""
        stream = self._stream(request_id)
        outs: list[RequestOutput] = []
        while not outs or not outs[-1].finished:
            outs.append(stream.get_sync(timeout))
        self._forget(request_id)
        return outs

    def abort(self, request_id: int) -> None:
        """Finish the request now with reason "abort"; its KV blocks are freed before the next step."""
        self._engine.abort(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(**self._engine.stats())

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (before the KV memory is released or rewritten); waits for
        the engine to do it between steps. Returns how many blocks left the cache."""
        return self._engine.reset_prefix_cache()

    def close(self) -> None:
        """Stop the engine; requests in flight finish with "abort"."""
        if self._closed and not self._poller.is_alive():
            return
        self._engine.shutdown()  # every output is in the channel after this
        with self._lock:
            self._closed = True
        self._poller.join()
        _OPEN_CLIENTS.discard(self)

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stream(self, request_id: int) -> _Stream:
        with self._lock:
            stream = self._streams.get(request_id)
        if stream is None:
            raise NotFoundError(f"no request {request_id} in this engine client",
                                hint="use the id submit() returned; a finished request's stream ends once")
        return stream

    def _forget(self, request_id: int) -> None:
        with self._lock:
            self._streams.pop(request_id, None)

    def _poll_loop(self) -> None:
        while True:
            raw = self._engine.poll(_POLL_SECONDS)
            if not raw and (self._closed or not self._engine.running):
                return
            wake: dict[asyncio.AbstractEventLoop, list[asyncio.Future]] = {}
            for t in raw:
                out = RequestOutput.from_native(t)
                with self._lock:
                    stream = self._streams.get(out.request_id)
                waiter = stream.put(out) if stream is not None else None
                if waiter is not None:
                    wake.setdefault(waiter[0], []).append(waiter[1])
            for loop, futures in wake.items():  # one wake-up per event loop for a step's outputs
                try:
                    loop.call_soon_threadsafe(_resolve, futures)
                except RuntimeError:  # the loop closed: its consumers are gone
                    pass
