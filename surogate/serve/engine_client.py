"""EngineClient: the Python handle on one model's native engine.

``submit`` queues a request and returns its id; ``stream(id)`` is an async iterator of its
``RequestOutput``s (``wait(id)`` blocks for all of them instead); ``generate`` does both and aborts
the request if the consumer goes away (client disconnect -> KV blocks freed). Each submitted
request is read to its end once, by one of them. A poller thread waits on the native output
channel with the GIL released and hands each engine step's outputs to their ``OutputStream``s:
one per request, or one for all the answers of a generation (surogate.serve.llm passes its own,
which detokenizes, applies stop strings and parsers as the outputs arrive, a step at a time).

The client also knows the model's LoRA adapters by name (``submit(..., adapter="name")``), loads
and unloads them at run time (``load_adapter`` / ``unload_adapter``, at most ``max_loras``, the
least recently used evicted first), and gives the model's memory back while it sleeps
(``release`` / ``restore``).

Adapters at run time: each load takes a slot number never used before on this engine, so the
prefix cache (whose hash chains are per slot) can never hand a new adapter the KV blocks of an
old one, nor the image encoder (keyed by slot too) its image rows. An unloaded adapter's name is
gone at once (a new request naming it is a NotFoundError); its requests already submitted run to
their end, and the runner drops its Programs and tensors (and projector) once the last of them
finished (the poller sees the finish after the step that produced it); then ``on_adapter_drop``'s
callbacks run (the image encoder forgets the slot's rows).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import logging
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import msgspec

from surogate import _native
from surogate.errors import InvalidArgumentError, NotFoundError, UnsupportedError
from surogate.serve.structured import TokenMasks
from surogate.serve.types import EmbedSpan, EngineConfig, EngineStats, RequestOutput, SamplingParams

log = logging.getLogger(__name__)

_POLL_SECONDS = 0.05
# Clients still open at exit are closed before the interpreter goes away: their engine thread may
# be about to call a Python runner, which must not happen during finalization.
_OPEN_CLIENTS: weakref.WeakSet[EngineClient] = weakref.WeakSet()

Waiter = tuple[asyncio.AbstractEventLoop, asyncio.Future]


@atexit.register
def _close_open_clients() -> None:
    for client in list(_OPEN_CLIENTS):
        client.close()


def _resolve(futures: list[asyncio.Future]) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_result(None)


class OutputStream:
    """Engine outputs for one consumer, async (``take``) or blocking (``take_sync``), from one
    request or several. The poller ``put``s each engine step's outputs for it at once, after
    ``process`` (a hook: the generation API's detokenization and parsers, which returns the
    outputs to keep) has run on them in the poller's thread. A consumer takes everything queued
    at once, so a consumer that falls behind catches up in one wake-up."""

    def __init__(self, process: Callable[[list[RequestOutput]], list[RequestOutput]] | None = None) -> None:
        self._items: collections.deque[RequestOutput] = collections.deque()
        self._cond = threading.Condition()
        self._waiter: Waiter | None = None
        self._process = process
        self._error: BaseException | None = None

    def put(self, outs: list[RequestOutput]) -> Waiter | None:
        """Queue a step's outputs; returns the async consumer's (loop, future) to wake, if one
        waits (the caller wakes each loop once for a whole step). A ``process`` that raises
        fails the stream: its consumer gets the error."""
        if self._process is not None:
            try:
                outs = self._process(outs)
            except Exception as e:  # a parser or tokenizer bug: the consumer decides what its client sees
                outs, self._error = [], e
            if not outs and self._error is None:  # nothing kept (outputs after a stop string): no wake-up
                return None
        with self._cond:
            self._items.extend(outs)
            self._cond.notify_all()
            waiter, self._waiter = self._waiter, None
        return waiter

    def _take(self) -> list[RequestOutput]:
        if self._error is not None:
            raise self._error
        items = list(self._items)
        self._items.clear()
        return items

    async def take(self, timeout: float | None = None) -> list[RequestOutput]:
        """Every output queued now, waiting for the next step's when there is none; [] once
        ``timeout`` seconds pass without one."""
        loop = asyncio.get_running_loop()
        with self._cond:
            if self._items or self._error is not None:
                return self._take()
            fut = loop.create_future()
            self._waiter = (loop, fut)
        timer = loop.call_later(timeout, _resolve, [fut]) if timeout is not None else None
        try:
            await fut
        finally:
            if timer is not None:
                timer.cancel()
        with self._cond:
            if self._waiter is not None and self._waiter[1] is fut:
                self._waiter = None
            return self._take()

    def take_sync(self, timeout: float | None = None) -> list[RequestOutput]:
        with self._cond:
            if not self._cond.wait_for(lambda: self._items or self._error is not None, timeout):
                return []
            return self._take()


def _native_runner(runner: Any, what: str) -> Any:
    """``runner`` as the engine takes it: its native ModelRunner, or a Python one wrapped."""
    native = getattr(runner, "native", runner)
    if isinstance(native, _native.serve.ModelRunner):
        return native
    if not (hasattr(runner, "run") and hasattr(runner, "vocab_size")):
        raise InvalidArgumentError(f"{what} {type(runner).__name__} is not a model runner",
                                   hint="pass a _native.serve.ModelRunner or an object with vocab_size and run(step)")
    return _native.serve.PyModelRunner(runner.run, int(runner.vocab_size), int(getattr(runner, "hidden_size", 0) or 0))


class EngineClient:
    """Drives a native engine over ``runner``: a ``_native.serve.ModelRunner``, an object that
    holds one as ``.native`` (surogate.serve.model_runner.ProgramRunner), or any object with
    ``vocab_size`` and ``run(step: StepInput) -> float32 array [len(step.logits_rows), V]``.
    ``adapters``: the LoRA adapters the runner holds, served name -> slot. ``max_loras``: how
    many adapters may be loaded at once (None: no limit); loading one more evicts the least
    recently used. ``draft``: the draft model's runner (any kind ``runner`` may be) for
    ``speculative_method="draft"``, its KV cache of ``config.num_blocks`` blocks of
    ``config.block_size`` (it is addressed with the engine's block ids); it sleeps and wakes with
    ``runner``."""

    def __init__(self, runner: Any, config: EngineConfig, adapters: Mapping[str, int] | None = None,
                 max_loras: int | None = None, draft: Any = None) -> None:
        if max_loras is not None and max_loras < 1:
            raise InvalidArgumentError(f"--max-loras {max_loras} must be at least 1")
        if max_loras is not None and len(adapters or {}) > max_loras:
            raise InvalidArgumentError(f"{len(adapters)} LoRA adapters given, more than --max-loras {max_loras}",
                                       hint="raise --max-loras or serve fewer adapters")
        self.runner = runner  # what release / restore act on (a ProgramRunner has both)
        self.draft = draft  # the draft model's runner (speculative_method "draft"), released with runner
        self.adapters = dict(adapters or {})  # served name -> slot, least recently used first
        self.max_loras = max_loras
        self._next_slot = max(self.adapters.values(), default=-1) + 1
        self._slot_users: collections.Counter[int] = collections.Counter()  # slot -> its requests not finished
        self._request_slot: dict[int, int] = {}  # request id -> its adapter slot (adapter requests only)
        self._retiring: set[int] = set()  # unloaded slots whose requests still run
        self._drop_callbacks: list[Callable[[int], None]] = []  # on_adapter_drop's
        self._loading = threading.Lock()
        self._weights = threading.Condition()  # weights_held's users and release's wait for them
        self._weight_users = 0
        self._released = False
        native = _native_runner(runner, "runner")
        draft_native = None
        if (config.speculative_method == "draft") != (draft is not None):
            raise InvalidArgumentError("speculative_method 'draft' and a draft model runner go together",
                                       hint="pass draft= with speculative_method='draft' (surogate serve "
                                            "--speculative-method draft --speculative-model PATH)")
        if draft is not None:
            if getattr(draft, "has_recurrent_state", False):
                raise InvalidArgumentError("the draft model keeps a per-sequence recurrent state (conv layers): "
                                           "its rejected drafts would stay in that state",
                                           hint="draft with an attention-only model of the same tokenizer")
            draft_native = _native_runner(draft, "draft")
        if getattr(runner, "has_recurrent_state", False) and config.enable_prefix_caching:
            # A cached prefix restores KV blocks, not the conv state of the tokens before it
            # (no snapshots at block boundaries yet): such a sequence must compute its prompt.
            log.warning("prefix caching is off: the model keeps a per-sequence recurrent state (conv layers) "
                        "that cached KV blocks cannot restore")
            config = msgspec.structs.replace(config, enable_prefix_caching=False)
        if getattr(runner, "has_recurrent_state", False) and config.speculative_method is not None:
            raise InvalidArgumentError(
                f"speculative decoding ({config.speculative_method}) on a model with a per-sequence recurrent state "
                "(conv layers): rejected draft tokens would stay in that state",
                hint="serve this model without --speculative-method")
        self._engine = _native.serve.Engine(native, config, draft_native)
        self.masks = TokenMasks()  # the grammars of constrained requests (structured outputs)
        self._engine.set_token_masker(self.masks.fill, self.masks.check)
        self._streams: dict[int, tuple[OutputStream, int]] = {}  # request id -> (its stream, its index there)
        self._unfinished: set[int] = set()  # submitted, no finished output yet (idle: the engine's stats lag a step)
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

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams | None = None, adapter: str | int | None = None,
               *, stream: OutputStream | None = None, index: int = 0, matcher: Any = None,
               embeds: Sequence[EmbedSpan] = ()) -> int:
        """Queue a request; returns its id. ``adapter``: a served adapter's name or slot; None =
        the base model. Its outputs go to ``stream`` (default: its own, for ``stream(id)`` /
        ``wait(id)``) with ``index`` set (which of the stream's requests it is: known before any
        output arrives). ``matcher``: the llguidance matcher of a request with
        ``structured_outputs`` (surogate.serve.structured.Grammars). ``embeds``: rows in place of
        prompt tokens' embeddings (image features; each span inside the prompt, none overlapping,
        rows of the model's hidden size). Bad input raises InvalidArgumentError naming the field."""
        params = params or SamplingParams()
        if params.n != 1 or params.stop:
            field = "n" if params.n != 1 else "stop"
            raise InvalidArgumentError(f"SamplingParams.{field} is the generation API's: the engine runs one sequence "
                                       "per request and sees only token ids",
                                       hint="submit through surogate.serve.LLM: it fans n out and applies stop strings")
        if (params.structured_outputs is None) != (matcher is None):
            raise InvalidArgumentError("SamplingParams.structured_outputs and the matcher go together",
                                       hint="submit through surogate.serve.LLM: it compiles the grammar")
        with self._lock:  # the poller dispatches under this lock: the stream exists before any output
            if self._closed:
                raise InvalidArgumentError("the engine client is closed", hint="create a new EngineClient")
            slot = self._slot(adapter)  # under the lock: an unload cannot drop the slot in between
            with self.masks.lock:  # the engine may step the request at once: its matcher is there first
                request_id = self._engine.submit(prompt_ids, params, -1 if slot is None else slot, embeds or None)
                if matcher is not None:
                    self.masks.add(request_id, matcher)
            self._streams[request_id] = (stream if stream is not None else OutputStream(), index)
            self._unfinished.add(request_id)
            if slot is not None and slot >= 0:
                self._request_slot[request_id] = slot
                self._slot_users[slot] += 1
        return request_id

    async def stream(self, request_id: int) -> AsyncIterator[RequestOutput]:
        """The request's outputs as they come, the last one with ``finish_reason`` set."""
        stream = self._stream(request_id)
        while True:
            for out in await stream.take():
                if out.finished:
                    self.forget(request_id)
                yield out
                if out.finished:
                    return

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                       adapter: str | int | None = None) -> AsyncIterator[RequestOutput]:
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
                self.forget(request_id)  # nobody reads the "abort" output

    def wait(self, request_id: int, timeout: float | None = None) -> list[RequestOutput]:
        """Block until the request finishes; all its outputs, in order."""
        stream = self._stream(request_id)
        outs: list[RequestOutput] = []
        while not outs or not outs[-1].finished:
            got = stream.take_sync(timeout)
            if not got:
                raise TimeoutError(f"no engine output within {timeout} s")
            outs.extend(got)
        self.forget(request_id)
        return outs

    def abort(self, request_id: int) -> None:
        """Finish the request now with reason "abort"; its KV blocks are freed before the next
        step. A finished (or unknown) request is left alone."""
        self._engine.abort(request_id)

    def forget(self, request_id: int) -> None:
        """Drop the request's stream: its outputs still to come are discarded."""
        with self._lock:
            self._streams.pop(request_id, None)

    def stats(self) -> EngineStats:
        return EngineStats(**self._engine.stats())

    def idle(self) -> bool:
        """Every request submitted has finished (its last output is out; the engine's stats would
        miss one submitted since its last step), and no ``weights_held`` block is open (an image
        encoding, a request being admitted)."""
        with self._lock:
            return not self._unfinished and self._weight_users == 0

    @contextlib.contextmanager
    def weights_held(self) -> Iterator[None]:
        """The model's weights stay on the device inside the block (work outside the engine's steps
        on them: an image encode, surogate.serve.LLM.embed; or a request's admission, from its
        encode until it is submitted, as the gateway does it): ``release`` waits for every such
        block to end, and ``idle`` is False inside one. Inside a released (sleeping) engine it
        raises UnsupportedError."""
        with self._weights:
            if self._released:
                raise UnsupportedError("the model is asleep (its memory is released): it encodes no images",
                                       hint="wake it (POST /wake_up, EngineClient.restore) first")
            self._weight_users += 1
        try:
            yield
        finally:
            with self._weights:
                self._weight_users -= 1
                self._weights.notify_all()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The engine takes no new step inside the block (the one in flight finishes): requests
        submitted there all reach its first step together, as one batch (GRPO submits a step's
        prompts x num_generations so, then drains), instead of the engine starting on the first
        while the rest are still being submitted. No ``reset_prefix_cache`` inside."""
        self._engine.hold()
        try:
            yield
        finally:
            self._engine.release()

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (before the KV memory is released or rewritten); waits for
        the engine to do it between steps. Returns how many blocks left the cache."""
        return self._engine.reset_prefix_cache()

    def release(self) -> None:
        """Sleep, once no request runs (``idle``): forget the prefix cache and let the runner
        give its memory back (KV cache, Programs, device weights) until ``restore``. Waits for
        the image encodes in flight (``weights_held``) first; later ones are refused until then."""
        with self._weights:
            self._released = True
            self._weights.wait_for(lambda: self._weight_users == 0)
        self.reset_prefix_cache()
        for runner in (self.runner, self.draft):
            if hasattr(runner, "release"):
                runner.release()

    def restore(self) -> None:
        for runner in (self.runner, self.draft):
            if hasattr(runner, "restore"):
                runner.restore()
        with self._weights:
            self._released = False

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

    # -- adapters at run time --

    def load_adapter(self, name: str, cfg: Any, params: Mapping[str, Any]) -> list[str]:
        """Serve a LoRA adapter (its config and our-named tensors, as
        surogate.models.peft.load_peft_adapter returns them) under ``name``, in a new slot.
        Returns the adapters evicted to stay within ``max_loras`` (least recently used first,
        preferring one with no request running). A name already served, or tensors that do not
        fit the model, raise InvalidArgumentError."""
        if not hasattr(self.runner, "add_adapter"):
            raise UnsupportedError(f"runner {type(self.runner).__name__} cannot load LoRA adapters",
                                   hint="serve the model through surogate.serve.model_runner.ProgramRunner")
        with self._loading:  # one load at a time: the name is checked and taken in one go
            with self._lock:
                if name in self.adapters:
                    raise InvalidArgumentError(f"The lora adapter '{name}' has already been loaded.",
                                               hint="unload it first (POST /v1/unload_lora_adapter)")
                slot, self._next_slot = self._next_slot, self._next_slot + 1
            self.runner.add_adapter(slot, cfg, params)  # checks the tensors against the model
            evicted, drop = [], []
            with self._lock:
                self.adapters[name] = slot
                while self.max_loras is not None and len(self.adapters) > self.max_loras:
                    idle = [n for n, s in self.adapters.items() if not self._slot_users[s]]
                    victim = idle[0] if idle else next(iter(self.adapters))
                    evicted.append(victim)
                    drop += self._retire(victim)
        self._drop(drop)
        return evicted

    def adapter_slot(self, adapter: str | int | None) -> int:
        """The engine slot of a served adapter (a name, or a slot as it is); -1: the base model
        (None). An unknown name is a NotFoundError."""
        if adapter is None:
            return -1
        if not isinstance(adapter, str):
            return int(adapter)
        with self._lock:
            slot = self.adapters.get(adapter)
        if slot is None:
            raise NotFoundError(f"no LoRA adapter named {adapter!r} on this engine",
                                hint=f"served adapters: {sorted(self.adapters) or 'none'}")
        return slot

    def on_adapter_drop(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(slot)`` once an adapter's slot is dropped (unloaded or evicted, its last
        request finished): what others keep for the slot (the image encoder's rows) goes too."""
        self._drop_callbacks.append(callback)

    def adapter_names(self) -> list[str]:
        """The adapters served now, least recently used first (a snapshot: submits reorder them)."""
        with self._lock:
            return list(self.adapters)

    def unload_adapter(self, name: str) -> None:
        """Stop serving adapter ``name``: new requests naming it are refused at once; those
        already submitted finish, then its slot is dropped. Unknown: NotFoundError."""
        with self._lock:
            if name not in self.adapters:
                raise NotFoundError(f"The lora adapter '{name}' cannot be found.",
                                    hint=f"loaded adapters: {sorted(self.adapters) or 'none'}")
            drop = self._retire(name)
        self._drop(drop)

    def _retire(self, name: str) -> list[int]:
        """(Under the lock.) Forget the name; its slot to drop now, or [] while requests use it."""
        slot = self.adapters.pop(name)
        if self._slot_users[slot]:
            self._retiring.add(slot)
            return []
        return [slot]

    def _drop(self, slots: list[int]) -> None:
        for slot in slots:
            self._retiring.discard(slot)
            self._slot_users.pop(slot, None)
            if hasattr(self.runner, "remove_adapter"):
                self.runner.remove_adapter(slot)
            for callback in self._drop_callbacks:
                callback(slot)

    def _slot(self, adapter: str | int | None) -> int | None:
        """(Under the lock.) The slot of a served adapter; naming it makes it the most recently used."""
        if not isinstance(adapter, str):
            return adapter
        slot = self.adapters.pop(adapter, None)
        if slot is None:
            raise NotFoundError(f"no LoRA adapter named {adapter!r} on this engine",
                                hint=f"served adapters: {sorted(self.adapters) or 'none'}")
        self.adapters[adapter] = slot  # to the back: the least recently used stay in front
        return slot

    def _stream(self, request_id: int) -> OutputStream:
        with self._lock:
            stream, _ = self._streams.get(request_id, (None, 0))
        if stream is None:
            raise NotFoundError(f"no request {request_id} in this engine client",
                                hint="use the id submit() returned; a finished request's stream ends once")
        return stream

    def _poll_loop(self) -> None:
        while True:
            raw = self._engine.poll(_POLL_SECONDS)
            if not raw and (self._closed or not self._engine.running):
                return
            self._dispatch(raw)

    def _dispatch(self, raw: list[tuple]) -> None:
        """One engine step's outputs (or several, when the poller fell behind): grouped by
        stream, each stream gets its share in one ``put``, and each event loop one wake-up."""
        drop = []
        with self._lock:
            streams = [self._streams.get(t[0]) for t in raw]
            for t in raw:
                if t[4] is not None:
                    self._unfinished.discard(t[0])
            if self._request_slot:
                for t in raw:
                    if t[4] is not None and (slot := self._request_slot.pop(t[0], None)) is not None:
                        self._slot_users[slot] -= 1
                        if not self._slot_users[slot] and slot in self._retiring:
                            drop.append(slot)  # its last request finished: no step uses it again
        if drop:
            self._drop(drop)
        if len(self.masks):
            for t in raw:
                if t[4] is not None:  # finished: its grammar is done
                    self.masks.release(t[0])
        by_stream: dict[OutputStream, list[RequestOutput]] = {}
        for target, t in zip(streams, raw):
            if target is not None:  # None: forgotten (its consumer left, or a stop string ended it)
                out = RequestOutput.from_native(t)
                out.index = target[1]
                by_stream.setdefault(target[0], []).append(out)
        wake: dict[asyncio.AbstractEventLoop, list[asyncio.Future]] = {}
        for stream, outs in by_stream.items():
            waiter = stream.put(outs)
            if waiter is not None:
                wake.setdefault(waiter[0], []).append(waiter[1])
        for loop, futures in wake.items():  # one wake-up per event loop for a step's outputs
            try:
                loop.call_soon_threadsafe(_resolve, futures)
            except RuntimeError:  # the loop closed: its consumers are gone
                pass
