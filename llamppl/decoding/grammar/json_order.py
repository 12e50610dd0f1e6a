"""The order of an object's keys in a JSON Schema grammar: :func:`order_keys` puts a value's keys in it.

llguidance's JSON compiler writes the keys of an object in one fixed order (its
``json_schema.md``: "order of properties is fixed to the order in schema"). With
``JSONBudget(key_order="schema")`` (the default) that order is part of the target, and this
module states it exactly, as the compiler builds it:

1. A schema node's keywords are read in the node's own text order. The plain keywords
   (``properties``, ``required``, ``additionalProperties``, ...) read so far form one piece;
   each *in-place applicator* (``allOf``, ``anyOf``, ``oneOf``, ``$ref``, ``const``,
   ``enum``) first closes that piece, then adds its own pieces in place (a piece that has
   ``additionalProperties`` but not yet ``properties`` holds the node's property names, as
   the compiler reads them there too): ``allOf``'s
   subschemas in order, ``$ref``'s target, the one branch of ``anyOf`` / ``oneOf`` that the
   value takes (the first that validates it: the grammar accepts an object when one branch
   accepts it), for ``const`` / ``enum`` the object constant itself (all its keys required,
   in its own order).
2. The object's pieces are intersected left to right: the properties of the earlier pieces
   come first, a later piece adds the properties not listed yet; ``required`` lists are
   joined the same way.
3. The object's keys are then: the listed properties in that order, then the required names
   not listed, then every other key (``additionalProperties`` / ``patternProperties``), in
   any order (they are kept in the value's order here).
4. A key's value follows the same rule under the intersection of the subschemas each piece
   gives it (its ``properties`` entry, else the matching ``patternProperties``, else
   ``additionalProperties``), in piece order; an array's items under ``prefixItems`` /
   ``items`` (an ``items`` array and ``additionalItems`` in the drafts before 2020-12).

``order_keys(schema, value)`` returns ``value`` with every object's keys in that order (a
copy; lists and scalars as they are). It reads the schema the grammar was compiled from
(:attr:`Grammar.order_keys <llamppl.decoding.grammar.compile.Grammar.order_keys>` passes it),
so a value it orders is spelled as the grammar expects::

    schema = {"properties": {"b": {}, "a": {}}, "required": ["c"]}
    order_keys(schema, {"c": 1, "a": 2, "z": 3, "b": 4})   # {'b': 4, 'a': 2, 'c': 1, 'z': 3}

With ``key_order="any"`` the grammar takes the keys in any order and no ordering is needed.
"""

from __future__ import annotations

import re
from typing import Any

from llamppl.decoding.grammar.json_relax import resolve_pointer

__all__ = ["order_keys"]

_APPLICATORS = ("allOf", "anyOf", "oneOf", "$ref", "const", "enum")
_MAX_DEPTH = 64  # $ref hops and nested pieces followed on one path


def order_keys(schema: Any, value: Any, draft: str | None = None) -> Any:
    """``value`` with each object's keys in the grammar's order for ``schema`` (module docstring).

    ``draft`` names the ``jsonschema`` validator class that picks an ``anyOf`` / ``oneOf``
    branch (None: the one ``jsonschema`` picks for ``schema``, Draft 2020-12 when it names
    none). Unresolvable references are read as ``{}``.
    """
    root = schema if isinstance(schema, dict) else {}
    return _Order(root, _validator(root, draft)).value([schema], value, 0)


def _validator(root: dict, draft: str | None) -> Any:
    """The ``jsonschema`` validator of ``root`` (its own draft unless ``draft`` names one),
    or None when the schema is unusable."""
    import jsonschema
    from jsonschema.validators import validator_for

    if draft is None:
        cls = validator_for(root, default=jsonschema.Draft202012Validator)
    else:
        cls = getattr(jsonschema, draft, jsonschema.Draft202012Validator)
    try:
        return cls(root)
    except Exception:  # noqa: BLE001 - an unusable schema: no branch validates
        return None


class _Order:
    """The ordering walk over one schema (the module docstring's rule)."""

    def __init__(self, root: dict, whole: Any) -> None:
        self.root, self.whole = root, whole

    def valid(self, node: Any, value: Any) -> bool:
        """Whether ``value`` validates against the subschema ``node`` (references resolved
        in the root); False when the validator cannot say."""
        try:
            return bool(self.whole.evolve(schema=node).is_valid(value))
        except Exception:  # noqa: BLE001 - no validator, or a malformed branch
            return False

    def target(self, ref: str) -> Any:
        """What ``ref`` names: a local JSON pointer, else what the validator's resolver finds
        from the root (``$id`` bases, anchors); ``{}`` when neither resolves it."""
        found = resolve_pointer(self.root, ref)
        if found is None and self.whole is not None:
            try:
                found = self.whole._resolver.lookup(ref).contents
            except Exception:  # noqa: BLE001 - unresolvable: read as {}
                found = None
        return {} if found is None else found

    def value(self, nodes: list[Any], value: Any, depth: int) -> Any:
        """``value`` ordered under the intersection of ``nodes`` (in order)."""
        if depth > _MAX_DEPTH:
            return value
        if isinstance(value, dict):
            pieces = [p for node in nodes for p in self.pieces(node, value, depth)]
            return self.object(pieces, value, depth)
        if isinstance(value, list):
            pieces = [p for node in nodes for p in self.pieces(node, value, depth)]
            return [self.value(_item_schemas(pieces, i), v, depth + 1) for i, v in enumerate(value)]
        return value

    def pieces(self, node: Any, value: Any, depth: int) -> list[dict]:
        """The plain-keyword pieces of ``node`` for ``value``, in the compiler's order."""
        if not isinstance(node, dict) or depth > _MAX_DEPTH:
            return []
        out: list[dict] = []
        current: dict = {}
        for key, sub in node.items():
            if key not in _APPLICATORS:
                current[key] = sub
                # the compiler reads additionalProperties (items) with the node's property names
                # (prefixItems) beside it, each as ``true``, even before they are read
                for later, slot in (
                    ("properties", "additionalProperties"),
                    ("prefixItems", "items"),
                ):
                    if key == slot and later not in current and later in node:
                        current[later] = _placeholders(node[later])
                continue
            if current:
                out.append(current)
                current = {}
            out += self.applied(key, sub, value, depth)
        if current:
            out.append(current)
        return out

    def applied(self, key: str, sub: Any, value: Any, depth: int) -> list[dict]:
        """The pieces an in-place applicator adds for ``value``."""
        if key == "allOf" and isinstance(sub, list):
            return [p for s in sub for p in self.pieces(s, value, depth + 1)]
        if key in ("anyOf", "oneOf") and isinstance(sub, list) and sub:
            branch = next((b for b in sub if self.valid(b, value)), sub[0])
            return self.pieces(branch, value, depth + 1)
        if key == "$ref" and isinstance(sub, str):
            return self.pieces(self.target(sub), value, depth + 1)
        if key == "const":
            return [_constant(sub)]
        if key == "enum" and isinstance(sub, list):
            same = next((v for v in sub if _equal(v, value)), None)
            return [_constant(same)]
        return []

    def object(self, pieces: list[dict], value: dict, depth: int) -> dict:
        listed: dict[str, None] = {}
        required: dict[str, None] = {}
        for piece in pieces:
            props = piece.get("properties")
            if isinstance(props, dict):
                listed.update(dict.fromkeys(props))
            names = piece.get("required")
            if isinstance(names, list):
                required.update(dict.fromkeys(n for n in names if isinstance(n, str)))
        order = list(listed) + [n for n in required if n not in listed]
        keys = [k for k in order if k in value] + [
            k for k in value if k not in listed and k not in required
        ]
        return {k: self.value(_property_schemas(pieces, k), value[k], depth + 1) for k in keys}


def _placeholders(keyword: Any) -> Any:
    """``properties`` (``prefixItems``) with every subschema ``true``: names and places only."""
    if isinstance(keyword, dict):
        return dict.fromkeys(keyword, True)
    return [True] * len(keyword) if isinstance(keyword, list) else keyword


def _constant(value: Any) -> dict:
    """The piece of an object constant: its keys listed and required, in its own order."""
    if not isinstance(value, dict):
        return {}
    return {"properties": {k: {"const": v} for k, v in value.items()}, "required": list(value)}


def _equal(a: Any, b: Any) -> bool:
    """JSON equality (``1 == 1.0``, ``True != 1``) of two values."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def _property_schemas(pieces: list[dict], key: str) -> list[Any]:
    """The subschemas ``key``'s value is under, one per piece that says something about it."""
    out = []
    for piece in pieces:
        props = piece.get("properties")
        if isinstance(props, dict) and key in props:
            out.append(props[key])
            continue
        patterns = piece.get("patternProperties")
        matched = (
            [s for p, s in patterns.items() if _search(p, key)]
            if isinstance(patterns, dict)
            else []
        )
        if matched:
            out += matched
        elif isinstance(piece.get("additionalProperties"), dict):
            out.append(piece["additionalProperties"])
    return out


def _item_schemas(pieces: list[dict], index: int) -> list[Any]:
    """The subschemas item ``index`` of an array is under, one per piece."""
    out = []
    for piece in pieces:
        prefix, items = piece.get("prefixItems"), piece.get("items")
        if isinstance(items, list):  # the drafts before 2020-12: a tuple, then additionalItems
            prefix, items = items, piece.get("additionalItems")
        if isinstance(prefix, list) and index < len(prefix):
            out.append(prefix[index])
        elif isinstance(items, dict):
            out.append(items)
    return out


def _search(pattern: str, key: str) -> bool:
    try:
        return re.search(pattern, key) is not None
    except re.error:
        return False
