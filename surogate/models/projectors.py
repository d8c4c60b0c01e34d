"""The multimodal projectors of served LoRA adapters (a run with ``train_projector``: peft's
modules_to_save, Gemma 3's multi_modal_projector, Qwen3-VL's visual.merger and
visual.deepstack_merger_list.*).

A served model keeps one vision tower; each adapter that trained the projector adds only its
projector's weights, by key (serving uses the engine's adapter slot). ``add`` reads them from the
adapter's tensors (surogate.models.peft.load_peft_adapter gives them under the model's HF names
less ``model.``, in HF's layout) through the family's name table, so they are our parameters in
the model's dtype, and checks each against the model's own (a tensor of another base model is an
error naming it). ``bind`` points a vision Executable's projector parameters at one key's weights
(or back at the model's): a pointer swap per parameter before a tower call, so the tower's
Programs and their weights serve every adapter. Device twins are made on a key's first tower
call and dropped with the model's device memory (a sleeping server).
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Mapping

import numpy as np

from surogate.errors import InvalidArgumentError, NotFoundError, UnsupportedError
from surogate.models.name_table import Direct, Transposed


class AdapterProjectors:
    """``model``'s adapters' projectors: key -> our-named weights. ``bind(exe, key)`` before a
    tower call (under the caller's tower lock: an Executable is never bound while it runs)."""

    def __init__(self, model):
        self.model = model
        self._host: dict[Hashable, dict[str, np.ndarray]] = {}
        self._device: dict[tuple[Hashable, str], object] = {}
        self._bound: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Executable -> the key it reads
        self._names: list[str] | None = None

    def __contains__(self, key: Hashable) -> bool:
        return key in self._host

    def __len__(self) -> int:
        return len(self._host)

    def names(self) -> list[str]:
        """Our names of the model's projector parameters (none for a model without images)."""
        if self._names is None:
            v = self.model.spec.vision
            prefixes = tuple(m + "." for m in v.projector_modules) if v is not None else ()
            self._names = sorted(n for n in self.model.params if prefixes and n.startswith(prefixes))
        return self._names

    def add(self, key: Hashable, tensors: Mapping[str, np.ndarray], what: str = "the adapter") -> None:
        """Serve ``key`` with these projector tensors (HF names less ``model.``, HF's layout): each
        replaces the model's parameter it names; the ones not given stay the model's."""
        m = self.model
        if not tensors:
            self.remove(key)
            return
        names = self.names()
        if not names:
            first = next(iter(tensors))
            raise InvalidArgumentError(f"{what} holds a multimodal projector (model.{first}), and this model has none",
                                       hint="serve the adapter on the vision model it was trained on")
        quantized = [n for n in names if n in m.quant]
        if quantized:
            raise UnsupportedError(f"this model's projector ({quantized[0]}) is kept as GGUF blocks: {what}'s "
                                   "projector cannot replace it",
                                   hint="serve the model's Hugging Face folder, or the merged model (`surogate merge`)")
        table = m.family.name_table()
        aliases = m.family.checkpoint_aliases or (lambda hf: (hf,))
        given = {**{f"model.{k}": k for k in tensors}, **{k: k for k in tensors}}  # a checkpoint name -> the adapter's
        host, used = {}, set()
        dt = m.np_dtype
        for name in names:
            r = table.recipe(name)
            if not isinstance(r, (Direct, Transposed)):
                raise UnsupportedError(f"{name}: the projector's parameters are read one tensor each",
                                       hint="this is a gap in the model family's name table; please report it")
            found = next((given[a] for a in (r.hf, *aliases(r.hf)) if a in given), None)
            if found is None:
                continue  # not trained: the model's own
            a = np.asarray(tensors[found], np.float32)
            want = tuple(m.params[name].shape)
            want_hf = want[::-1] if isinstance(r, Transposed) else want
            if a.shape != want_hf:
                raise InvalidArgumentError(f"{what}'s projector tensor model.{found} has shape {list(a.shape)}, "
                                           f"this model's is {list(want_hf)}",
                                           hint="the adapter was trained on another base model: serve it on its own")
            used.add(found)
            host[name] = np.ascontiguousarray((a.T if isinstance(r, Transposed) else a).astype(dt))
        unknown = sorted(set(tensors) - used)
        if unknown:
            raise InvalidArgumentError(f"{what}'s projector tensor model.{unknown[0]} is none of this model's "
                                       f"projector parameters ({len(names)}: {', '.join(names[:3])}, ...)",
                                       hint="the adapter was trained on another base model (e.g. more DeepStack "
                                            "mergers): serve it on its own")
        self.remove(key)
        self._host[key] = host

    def remove(self, key: Hashable) -> None:
        """Forget ``key``'s projector (an Executable still pointing at it lets go at its next bind)."""
        self._host.pop(key, None)
        for k in [k for k in self._device if k[0] == key]:
            del self._device[k]

    def release_device(self) -> None:
        """Drop the device twins (the model's device memory is given back); made again on use."""
        self._device.clear()
        self._bound = weakref.WeakKeyDictionary()

    def bind(self, exe, key: Hashable | None) -> None:
        """``exe``'s projector parameters read ``key``'s weights (None: the model's own)."""
        if self._bound.get(exe, None) == key:
            return
        if key is not None and key not in self._host:
            raise NotFoundError(f"no adapter projector {key!r} on this model (unloaded meanwhile?)",
                                hint="load the adapter again")
        m = self.model
        mine = self._host.get(key, {}) if key is not None else {}
        params = set(exe.external_names("param"))
        for name in self.names():
            if name not in params:
                continue
            if name in mine:
                exe.bind(name, mine[name], self._device_twin(key, name))
            else:
                exe.bind(name, m.params[name], m.device_param(name))
        self._bound[exe] = key

    def _device_twin(self, key: Hashable, name: str):
        if self.model.device == "cpu":
            return None
        t = self._device.get((key, name))
        if t is None:
            from surogate import _native

            t = self._device[(key, name)] = _native.tensor(self._host[key][name]).to(self.model.device)
        return t
