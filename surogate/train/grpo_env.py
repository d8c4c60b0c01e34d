"""Rewards and generated prompt sets for `surogate grpo`: the built-in environments, and the
loading of the reward functions a config names.

A reward function is ``fn(prompt, completion, row) -> float``: ``prompt`` as the row gives it (a
string, or a list of messages), ``completion`` the sampled text, ``row`` the whole dataset row
(a dict: the answer, metadata). Config names: ``"pkg.module:fn"`` (any importable module; a
dotted attribute path after the colon works too), or one of the built-in names below.

Built-ins:

- ``arithmetic_exact``: 1.0 when the completion's answer equals the row's ``answer`` (the text
  inside ``<answer>...</answer>`` if there is one, else the last number in the completion).
- ``answer_format``: 1.0 for exactly one ``<answer>...</answer>`` span, 0.5 for an opened but
  unclosed or repeated one, else 0.
- ``length``: 1 - |len - target| / max(len, target) over characters, target the row's
  ``target_length`` (default 64): 1.0 at the target, falling towards 0 either side.

Generated sets (a dataset ``path: builtin:NAME``, ``samples`` rows, default 1000, drawn from the
run's seed): ``arithmetic`` (``"What is 3 + 4? ..."`` with ``answer``; additions and subtractions of
numbers below ``ARITHMETIC_MAX``).
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable

import numpy as np

from surogate.errors import ConfigError

RewardFn = Callable[[object, str, dict], float]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
ARITHMETIC_MAX = 10
BUILTIN_PREFIX = "builtin:"


def _answer_text(completion: str) -> str | None:
    m = _ANSWER.findall(completion)
    if m:
        return m[-1].strip()
    nums = _NUMBER.findall(completion)
    return nums[-1] if nums else None


def arithmetic_exact(prompt, completion: str, row: dict) -> float:
    got = _answer_text(completion)
    if got is None:
        return 0.0
    nums = _NUMBER.findall(got)
    if not nums:
        return 0.0
    try:
        return 1.0 if math.isclose(float(nums[-1]), float(row["answer"])) else 0.0
    except (KeyError, TypeError, ValueError):
        return 0.0


def answer_format(prompt, completion: str, row: dict) -> float:
    opened, closed = completion.count("<answer>"), completion.count("</answer>")
    if opened == 1 and closed == 1 and completion.index("<answer>") < completion.index("</answer>"):
        return 1.0
    return 0.5 if opened else 0.0


def length(prompt, completion: str, row: dict) -> float:
    target = float(row.get("target_length", 64)) if isinstance(row, dict) else 64.0
    n = float(len(completion))
    return 1.0 - abs(n - target) / max(n, target, 1.0)


BUILTIN_REWARDS: dict[str, RewardFn] = {"arithmetic_exact": arithmetic_exact, "answer_format": answer_format,
                                        "length": length}


def load_reward_functions(names: list[str]) -> list[tuple[str, RewardFn]]:
    """(display name, callable) per config entry; a ConfigError naming ``reward_functions[i]``
    when one does not resolve to a callable."""
    out = []
    for i, spec in enumerate(names):
        key = f"reward_functions[{i}]"
        if ":" not in spec:
            fn = BUILTIN_REWARDS.get(spec)
            if fn is None:
                raise ConfigError(f"{key}: {spec!r} is not a built-in reward",
                                  hint=f"use one of {', '.join(BUILTIN_REWARDS)}, or an import path 'pkg.module:fn'")
            out.append((spec, fn))
            continue
        module_name, _, attr = spec.partition(":")
        if not module_name or not attr:
            raise ConfigError(f"{key}: {spec!r} is not of the form 'pkg.module:fn'")
        try:
            obj = importlib.import_module(module_name)
        except ImportError as e:
            raise ConfigError(f"{key}: cannot import module {module_name!r} ({e})",
                              hint="is the module on PYTHONPATH (or installed)? the path is the one `import` takes"
                              ) from None
        except Exception as e:  # the module itself fails as it loads
            raise ConfigError(f"{key}: importing module {module_name!r} raised {type(e).__name__}: {e}",
                              hint="fix the module (try `python -c 'import {}'`)".format(module_name)) from None
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise ConfigError(f"{key}: module {module_name!r} has no attribute {attr!r}",
                                  hint="check the function's name after the colon") from None
            obj = getattr(obj, part)
        if not callable(obj):
            raise ConfigError(f"{key}: {spec} is a {type(obj).__name__}, not a function",
                              hint="name a function fn(prompt, completion, row) -> float")
        out.append((attr.rsplit(".", 1)[-1], obj))
    return out


def call_reward(name: str, fn: RewardFn, prompt, completion: str, row: dict) -> float:
    """One reward as a float; a function that raises or returns a non-number is an error naming it."""
    try:
        value = fn(prompt, completion, row)
    except Exception as e:
        raise RuntimeError(f"reward function {name} raised {type(e).__name__}: {e}") from e
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"reward function {name} returned {value!r}, not a number") from None
    if math.isnan(value):
        raise ValueError(f"reward function {name} returned NaN")
    return value


# -- generated prompt sets --

def arithmetic_rows(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng([seed, 0x61726974])
    rows = []
    for _ in range(n):
        a, b = (int(x) for x in rng.integers(0, ARITHMETIC_MAX, 2))
        op = "+" if rng.random() < 0.5 else "-"
        if op == "-" and b > a:
            a, b = b, a
        answer = a + b if op == "+" else a - b
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} {op} {b}? Reply with the number only."}],
                     "answer": answer})
    return rows


GENERATED_SETS: dict[str, Callable[[int, int], list[dict]]] = {"arithmetic": arithmetic_rows}


def generated_rows(path: str, samples: int | None, seed: int, where: str) -> list[dict]:
    name = path[len(BUILTIN_PREFIX):]
    make = GENERATED_SETS.get(name)
    if make is None:
        raise ConfigError(f"{where}.path: no generated set {name!r}",
                          hint=f"use one of {', '.join(BUILTIN_PREFIX + k for k in GENERATED_SETS)}")
    return make(samples or 1000, seed)
