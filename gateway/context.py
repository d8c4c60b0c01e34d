"""Per-request state the edge and the handlers share: ids, timings, token counts, and the
generations in flight (so a client that goes away gets them aborted, streaming or not)."""

from __future__ import annotations

import time

from surogate.serve import Generation


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
        self._live: list[Generation] = []

    # -- generations --

    def track(self, generation: Generation) -> None:
        self._live.append(generation)

    def abort_all(self) -> None:
        """Abort every engine request still running; the answers end with reason "abort"."""
        live, self._live = self._live, []
        for generation in live:
            generation.abort()

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
