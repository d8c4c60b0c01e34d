"""A JSON schema check of our own, for `surogate bench serve --structured`: whether a constrained
answer validates, checked apart from the grammar engine that wrote it (no jsonschema dependency;
tests/bench checks it against jsonschema). The subset llguidance follows; a keyword outside it is
an error of its own, never silently passed."""

from __future__ import annotations

import json
import math
import re
from typing import Any

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is_type(doc: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(doc, int) and not isinstance(doc, bool) or isinstance(doc, float) and doc.is_integer()
    if name == "number":
        return isinstance(doc, (int, float)) and not isinstance(doc, bool)
    return isinstance(doc, _TYPES[name]) if name in _TYPES else False


def _multiple_of(x: float, m: float) -> bool:
    from fractions import Fraction  # exact on the decimal text: 12.34 is a multiple of 0.01

    q = Fraction(repr(x)) / Fraction(repr(m))
    return q.denominator == 1


def schema_errors(doc: Any, schema: dict | bool, path: str = "$") -> list[str]:
    """Where ``doc`` breaks ``schema``: type, enum, const, properties / required /
    additionalProperties, items / prefixItems / minItems / maxItems / uniqueItems, string lengths
    and pattern, numeric bounds and multipleOf, anyOf / oneOf / allOf / not, local $ref. A keyword
    outside this subset is an error of its own (never silently passed)."""
    return _errors(doc, schema, path, schema if isinstance(schema, dict) else {})


_IGNORED = {"$schema", "$id", "title", "description", "default", "examples", "$defs", "definitions", "format",
            "$comment", "readOnly", "writeOnly", "deprecated"}


def _errors(doc: Any, schema: dict | bool, path: str, root: dict) -> list[str]:
    if schema is True or schema == {}:
        return []
    if schema is False:
        return [f"{path}: no value is allowed"]
    out: list[str] = []
    for key, want in schema.items():
        if key == "$ref":
            if not want.startswith("#"):
                out.append(f"{path}: $ref {want!r} is not local")
                continue
            target: Any = root
            for part in filter(None, want[1:].split("/")):
                target = target[part.replace("~1", "/").replace("~0", "~")]
            out += _errors(doc, target, path, root)
        elif key == "type":
            names = want if isinstance(want, list) else [want]
            if not any(_is_type(doc, n) for n in names):
                out.append(f"{path}: {type(doc).__name__} is not {want}")
        elif key == "enum":
            if not any(doc == v and type(doc) is type(v) or _is_type(doc, "number") and _is_type(v, "number")
                       and doc == v for v in want):
                out.append(f"{path}: {doc!r} is not one of {want}")
        elif key == "const":
            if doc != want:
                out.append(f"{path}: {doc!r} is not {want!r}")
        elif key in ("anyOf", "oneOf", "allOf"):
            ok = [not _errors(doc, s, path, root) for s in want]
            good = {"anyOf": any(ok), "oneOf": sum(ok) == 1, "allOf": all(ok)}[key]
            if not good:
                out.append(f"{path}: {key} fails ({sum(ok)} of {len(ok)} match)")
        elif key == "not":
            if not _errors(doc, want, path, root):
                out.append(f"{path}: matches a `not` schema")
        elif key in ("properties", "required", "additionalProperties", "minProperties", "maxProperties"):
            if not isinstance(doc, dict):
                continue
            if key == "properties":
                for name, sub in want.items():
                    if name in doc:
                        out += _errors(doc[name], sub, f"{path}.{name}", root)
            elif key == "required":
                out += [f"{path}: {name!r} is missing" for name in want if name not in doc]
            elif key == "additionalProperties":
                extra = [k for k in doc if k not in schema.get("properties", {})]
                for k in extra:
                    out += _errors(doc[k], want, f"{path}.{k}", root)
            elif key == "minProperties" and len(doc) < want or key == "maxProperties" and len(doc) > want:
                out.append(f"{path}: {len(doc)} properties breaks {key} {want}")
        elif key in ("items", "prefixItems", "minItems", "maxItems", "uniqueItems"):
            if not isinstance(doc, list):
                continue
            if key == "prefixItems":
                for i, (x, sub) in enumerate(zip(doc, want)):
                    out += _errors(x, sub, f"{path}[{i}]", root)
            elif key == "items":
                start = len(schema.get("prefixItems", ()))
                for i, x in enumerate(doc[start:], start):
                    out += _errors(x, want, f"{path}[{i}]", root)
            elif key == "minItems" and len(doc) < want or key == "maxItems" and len(doc) > want:
                out.append(f"{path}: {len(doc)} items breaks {key} {want}")
            elif key == "uniqueItems" and want and len({json.dumps(x, sort_keys=True) for x in doc}) < len(doc):
                out.append(f"{path}: items are not unique")
        elif key in ("minLength", "maxLength", "pattern"):
            if not isinstance(doc, str):
                continue
            if key == "pattern":
                if re.search(want, doc) is None:
                    out.append(f"{path}: {doc!r} does not match {want!r}")
            elif key == "minLength" and len(doc) < want or key == "maxLength" and len(doc) > want:
                out.append(f"{path}: length {len(doc)} breaks {key} {want}")
        elif key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
            if not _is_type(doc, "number"):
                continue
            bad = {"minimum": lambda: doc < want, "maximum": lambda: doc > want,
                   "exclusiveMinimum": lambda: doc <= want, "exclusiveMaximum": lambda: doc >= want,
                   "multipleOf": lambda: not (math.isfinite(doc) and _multiple_of(doc, want))}[key]()
            if bad:
                out.append(f"{path}: {doc!r} breaks {key} {want}")
        elif key not in _IGNORED:
            out.append(f"{path}: the bench's schema check does not know {key!r}")
    return out
