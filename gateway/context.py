"""Per-request state the edge and the handlers share: ids, timings, token counts, and the engine
requests in flight (so a client that goes away gets them aborted, streaming or not)."""

from __future__ import annotations

import time

from .engine import EngineClient, resolve


class RequestContext:
    def __init__(self, request_id: str, api: str, path: str):
        self.request_id = request_id
        self.api = api  # "openai" | "anthropic": whose error envelope this route speaks
        self.path = path
        self.started = time.perf_counter()
        self.created = int(time.time())
        self.model: str | None = None
        self.status = 0
        self.stream = False
        self.n = 1
        self.max_tokens: int | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.finish_reasons: list[str] = []
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.inter_token: list[float] = []
        self.disconnected = False
        self.responded = False  # the last byte of the reply was sent
        self.error: str | None = None
        self._live: dict[str, EngineClient] = {}
        self._queues: dict[str, set[str]] = {}  # request id -> its model's queue (ServedModel.queued)

    # -- engine requests --

    def track(self, engine: EngineClient, request_id: str, queue: set[str] | None = None) -> None:
        """A submitted engine request; ``queue`` counts it as waiting until ``dequeue``."""
        self._live[request_id] = engine
        if queue is not None:
            queue.add(request_id)
            self._queues[request_id] = queue

    def dequeue(self, request_id: str) -> None:
        """The request has output (or is over): it no longer waits."""
        queue = self._queues.pop(request_id, None)
        if queue is not None:
            queue.discard(request_id)

    def untrack(self, request_id: str) -> None:
        self._live.pop(request_id, None)
        self.dequeue(request_id)

    @property
    def live(self) -> list[str]:
        return list(self._live)

    async def abort(self, request_id: str) -> None:
        self.dequeue(request_id)
        engine = self._live.pop(request_id, None)
        if engine is not None:
            await resolve(engine.abort(request_id))

    async def abort_all(self) -> None:
        for request_id in list(self._live):
            await self.abort(request_id)

    # -- timings --

    def on_tokens(self, n: int) -> None:
        if n <= 0:
            return
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        elif self.last_token_at is not None:
            self.inter_token.append((now - self.last_token_at) / n)
        self.last_token_at = now

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started
