"""LoRA adapters at run time: ``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``,
in vLLM's bodies (``{"lora_name", "lora_path"}`` / ``{"lora_name"}``) and answers (200 with a
text/plain "Success: ..." line; an adapter already loaded, or a folder that is missing, corrupt or
made for another base model, a 400; unloading an unknown name a 404), in the OpenAI error shape.

The adapter goes on the one model served, or the one named by ``model`` (in the body or as
``?model=``, as ``POST /sleep`` takes it). Once loaded it is listed in /v1/models (``parent``: its
base) and requests with ``model: <lora_name>`` run through it. The model's engine client holds at
most ``--max-loras``: loading one more evicts the least recently used (its name is gone, like an
unload). Unloading refuses new requests at once; those already running finish.
"""

from __future__ import annotations

import asyncio
import logging

from surogate.errors import SurogateError

from . import errors
from .context import RequestContext
from .errors import ApiError, Kind
from .http import RawReply
from .models import ServedModel
from .openai import protocol as p
from .serving import Gateway

log = logging.getLogger("surogate.gateway")


def admin_target(gw: Gateway, name: str | None, what: str = "sleep and wake") -> ServedModel | ApiError:
    """The base model an admin route acts on: the one served, or the one ``name`` names."""
    if name is None:
        if len(gw.models.models) == 1:
            return next(iter(gw.models))
        return errors.invalid("Name the model: `?model=<name>` (this server has several).", param="model")
    found = gw.find(name)
    if isinstance(found, ApiError):
        return found
    if found[1] is not None:
        return errors.invalid(f"`{name}` is an adapter; {what} its base model `{found[0].name}`.", param="model")
    return found[0]


def _served(model: ServedModel) -> tuple[str, ...]:
    """The model's adapters after a change, in load order (the engine's table is in LRU order)."""
    now = model.engine.adapter_names()
    return tuple(a for a in model.adapters if a in now) + tuple(a for a in now if a not in model.adapters)


def _text(line: str) -> RawReply:
    return RawReply(line.encode(), b"text/plain; charset=utf-8")


async def load_lora_adapter(gw: Gateway, ctx: RequestContext, req: p.LoadLoRAAdapterRequest, model: str | None):
    if not req.lora_name or not req.lora_path:
        return errors.invalid("Both 'lora_name' and 'lora_path' must be provided.",
                              param="lora_name" if not req.lora_name else "lora_path")
    target = admin_target(gw, req.model or model, "load adapters on")
    if isinstance(target, ApiError):
        return target
    if not target.generates:
        return errors.invalid(f"`{target.name}` is an embedding model: it takes no LoRA adapters.", param="model")
    if target.engine is None:
        return errors.model_loading(target.name)
    if gw.models.lookup(req.lora_name) is not None:
        clash = "has already been loaded" if req.lora_name in target.adapters else "is already a served model's name"
        return errors.invalid(f"The lora adapter '{req.lora_name}' {clash}.", param="lora_name")
    engine = target.engine

    def load() -> list[str]:
        from surogate.models.peft import load_peft_adapter

        cfg, params = load_peft_adapter(req.lora_path)
        return engine.load_adapter(req.lora_name, cfg, params)

    try:
        evicted = await asyncio.to_thread(load)
    except SurogateError as e:  # missing or corrupt folder, tensors that do not fit the base model
        message = f"{e.message} ({e.hint})" if e.hint else e.message
        return ApiError(Kind.invalid_request, f"Cannot load the lora adapter '{req.lora_name}' from "
                                              f"{req.lora_path}: {message}", param="lora_path")
    target.adapters = _served(target)
    log.info("loaded LoRA adapter %s from %s on %s%s", req.lora_name, req.lora_path, target.name,
             f" (evicted {', '.join(evicted)})" if evicted else "")
    return _text(f"Success: LoRA adapter '{req.lora_name}' added successfully.")


async def unload_lora_adapter(gw: Gateway, ctx: RequestContext, req: p.UnloadLoRAAdapterRequest, model: str | None):
    if not req.lora_name:
        return errors.invalid("'lora_name' must be provided.", param="lora_name")
    name = req.model or model
    if name is None:  # the adapter's own name says which model holds it
        found = gw.models.lookup(req.lora_name)
        target = found[0] if found is not None and found[1] is not None else None
    else:
        target = admin_target(gw, name, "unload adapters from")
        if isinstance(target, ApiError):
            return target
    if target is None or req.lora_name not in target.adapters:
        return ApiError(Kind.not_found, f"The lora adapter '{req.lora_name}' cannot be found.", param="lora_name")
    if target.engine is None:
        return errors.model_loading(target.name)
    try:
        target.engine.unload_adapter(req.lora_name)
    except LookupError as e:  # evicted meanwhile
        return ApiError(Kind.not_found, str(getattr(e, "message", e)), param="lora_name")
    target.adapters = _served(target)
    log.info("unloaded LoRA adapter %s from %s", req.lora_name, target.name)
    return _text(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")
