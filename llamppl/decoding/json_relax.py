"""The last tiers of JSON Schema compilation: a superset grammar llguidance accepts, and what was dropped.

When even llguidance's relaxed compiler refuses a schema, :func:`strip_unsupported` removes
the keywords it cannot express — each removal only *enlarges* the set of accepted JSON
texts, so the grammar's language is a superset of the valid texts and the final
``jsonschema`` check (the complete check of :class:`~llamppl.decoding.grammar_compile.Grammar`)
restores the exact target:

- a ``pattern`` whose regular expression llguidance cannot parse (lookarounds,
  backreferences, syntax of other engines): dropped from the grammar, kept as a prefix check
  on that string (:class:`~llamppl.decoding.json_patterns.JSONStringPatterns`, with the
  ``regex`` package, which has lookarounds and backreferences);
- ``patternProperties`` with such a regex: dropped, together with the object's
  ``additionalProperties`` (any further key and value is then allowed);
- the sibling keywords of a ``$ref`` (llguidance refuses them on circular references):
  dropped, the ``$ref`` kept.

:func:`skeleton` is the tier after that: only the schema's top-level ``type``, for schemas
too large for the engine. :func:`is_refusal` tells the errors that no superset can cure: an
unsatisfiable schema, or a reference that does not resolve::

    stripped, dropped = strip_unsupported(schema)
    dropped      # [(("password",), "^(?=.*\\d).{8,}$"), ...]: (JSON path, pattern) pairs
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["is_refusal", "skeleton", "strip_unsupported", "WILDCARD"]

#: A path element standing for any array index or any object key.
WILDCARD = "*"
_REF_KEEP = {"$ref", "$defs", "definitions", "$id", "$schema", "$anchor", "title", "description"}
_REFUSALS = ("unsatisfiable", "does not exist", "unresolvable", "unknown reference", "not found")
_MAX_DEPTH = 12  # $ref chains followed when collecting dropped patterns' paths


def is_refusal(error: str | None) -> bool:
    """Whether llguidance's ``error`` says the schema has no valid instance or an unresolvable
    reference (then it is refused, not relaxed)."""
    text = (error or "").lower()
    return any(word in text for word in _REFUSALS)


def strip_unsupported(
    schema: Any, regex_ok: Callable[[str], bool]
) -> tuple[Any, list[tuple[tuple[str, ...], str]]]:
    """``schema`` without the keywords above, and the dropped ``(path, pattern)`` pairs.

    ``regex_ok(pattern)`` says whether the grammar engine parses a pattern. A path lists
    property names from the root, :data:`WILDCARD` for array items and free keys; patterns
    reached through ``$ref`` get the path of where the reference is used.
    """
    root = schema if isinstance(schema, dict) else {}
    dropped: list[tuple[tuple[str, ...], str]] = []

    def strip(node: Any) -> Any:
        if isinstance(node, list):
            return [strip(x) for x in node]
        if not isinstance(node, dict):
            return node
        out = {k: strip(v) for k, v in node.items()}
        if isinstance(out.get("pattern"), str) and not regex_ok(out["pattern"]):
            del out["pattern"]
        props = out.get("patternProperties")
        if isinstance(props, dict) and not all(regex_ok(k) for k in props):
            del out["patternProperties"]
            out.pop("additionalProperties", None)
        if "$ref" in out:
            out = {k: v for k, v in out.items() if k in _REF_KEEP}
        return out

    def collect(node: Any, path: tuple[str, ...], depth: int) -> None:
        if not isinstance(node, dict) or depth > _MAX_DEPTH:
            return
        if isinstance(node.get("pattern"), str) and not regex_ok(node["pattern"]):
            dropped.append((path, node["pattern"]))
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            collect(_resolve(root, ref), path, depth + 1)
        for key in ("allOf", "anyOf", "oneOf"):
            for sub in node.get(key, []) if isinstance(node.get(key), list) else []:
                collect(sub, path, depth)
        for name, sub in (node.get("properties") or {}).items():
            collect(sub, path + (name,), depth)
        for key in ("items", "additionalProperties", "additionalItems"):
            if isinstance(node.get(key), dict):
                collect(node[key], path + (WILDCARD,), depth)
        for sub in node.get("prefixItems", []) if isinstance(node.get("prefixItems"), list) else []:
            collect(sub, path + (WILDCARD,), depth)

    collect(root, (), 0)
    unique = list(dict.fromkeys(dropped))
    return strip(schema), unique


def _resolve(root: dict, ref: str) -> Any:
    """The node a local ``#/...`` JSON pointer names (None when it does not resolve)."""
    node: Any = root
    for part in ref.lstrip("#").strip("/").split("/") if ref.strip("#/") else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def skeleton(schema: Any) -> dict:
    """Only the top-level ``type`` of ``schema`` (any JSON value when it names none)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    return {"type": kind} if isinstance(kind, (str, list)) else {}
