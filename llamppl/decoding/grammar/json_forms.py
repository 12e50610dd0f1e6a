"""The schema a JSON grammar is compiled from: the schema's own draft, number spellings and key order.

:func:`grammar_schema` turns a JSON Schema into the one llguidance compiles, beside the
size budget of :mod:`~llamppl.decoding.grammar.json_budget`; the final ``jsonschema`` check
(:mod:`~llamppl.decoding.grammar.json_check`) always reads the user's schema. Each step
either keeps the grammar's language or enlarges it by texts the final check refuses, so
the target stays the LM conditioned on validity (and on the budget):

- **the draft's reading** (:func:`ref_alone`) — in drafts 3 to 7 a ``$ref`` hides its
  sibling keywords (the validator of the schema's ``$schema`` ignores them); llguidance
  intersects them. So in those drafts the siblings are dropped, and grammar and check read
  the schema alike (``definitions`` / ``$defs`` stay: references resolve into them). And
  ``additionalProperties`` covers the keys its node's ``patternProperties`` do not, wherever
  they stand; llguidance reads a node's keywords in order and tells ``additionalProperties``
  the node's ``properties`` only, so a ``patternProperties`` written after it and after an
  applicator is moved before it (:func:`patterns_first`; the order of the keys is kept);
- **any spelling of a number** (:func:`open_numbers`, when ``max_decimals=None``) —
  llguidance writes a number under ``minimum`` / ``maximum`` / ``multipleOf``, or one of an
  ``enum`` / ``const``, in one plain form (``2`` for ``enum: [2.0]``, no exponent: ``1e-06``
  refused under ``minimum: 0``), and an integer without a fraction (``1.0`` is an integer
  from Draft 6 on). With no cap on decimals every JSON spelling of an allowed number is in
  the target: those keywords are left to the final check, integers are written as numbers
  from Draft 6 on, and the grammar keeps "a number here";
- **any key order** (:func:`any_key_order`, when ``key_order="any"``) — llguidance fixes
  the order of an object's keys (:mod:`~llamppl.decoding.grammar.json_order` states it).
  For any order, each listed property becomes a ``patternProperties`` entry matching its
  name alone (a name an existing pattern matches falls under that pattern's schema), and
  ``required`` goes to the final check, as do the keys of ``const`` / ``enum`` objects;
  the check also refuses a key written twice (:class:`~llamppl.decoding.grammar.json_check.SchemaCheck`);
- :func:`without_min_properties` — for the relaxed tier, when llguidance's lenient reading
  of ``minProperties`` would demand unlisted keys (it applies the bound to the keys beyond
  ``properties`` when some listed ones are optional, a smaller language, not a larger one).

The keywords whose values are JSON instances (``const``, ``enum``, ``default``,
``examples``) are data and are never rewritten as schemas::

    grammar_schema({"type": "integer", "minimum": 0}, JSONBudget(max_decimals=None))
    # {'type': 'number'}
"""

from __future__ import annotations

from typing import Any

import regex

from llamppl.decoding.grammar.json_budget import JSONBudget
from llamppl.decoding.grammar.json_relax import dialect_of, draft_of

__all__ = [
    "DRAFT_URIS",
    "any_key_order",
    "exact_name",
    "grammar_schema",
    "open_numbers",
    "patterns_first",
    "ref_alone",
    "without_min_properties",
]

_DATA = ("const", "enum", "default", "examples")
_APPLICATORS = ("allOf", "anyOf", "oneOf", "$ref", "const", "enum")
_KEEP_BESIDE_REF = ("$ref", "definitions", "$defs", "$schema")
_NUMERIC = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_MAP_KEYWORDS = (
    "properties",
    "patternProperties",
    "definitions",
    "$defs",
    "dependentSchemas",
    "dependencies",
)
_INTEGER_IS_NUMBER = (
    "Draft6Validator",
    "Draft7Validator",
    "Draft201909Validator",
    "Draft202012Validator",
)


def grammar_schema(
    schema: Any, budget: JSONBudget, draft: str | None = None, closed: bool | None = None
) -> Any:
    """The schema llguidance compiles for ``schema`` under ``budget``: :func:`ref_alone`,
    the budget's sizes (``budget.apply``, ``closed`` overriding ``closed_objects``), then
    :func:`open_numbers` when ``max_decimals`` is None and :func:`any_key_order` when
    ``key_order`` is ``"any"``. ``draft`` names the validator class of the schema (None:
    the one ``jsonschema`` picks)."""
    draft = draft if draft is not None else draft_of(schema if isinstance(schema, dict) else {})
    out = budget.apply(patterns_first(ref_alone(schema, draft)), closed=closed)
    if budget.max_decimals is None:
        out = open_numbers(out, draft)
    if budget.key_order == "any":
        out = any_key_order(out, draft)
    return out


def _rewrite(node: Any, visit, draft: str) -> Any:
    """``node`` with ``visit(schema_node, draft)`` applied to every schema node, bottom-up: the
    values of schema-valued keywords, the entries of the keywords that map names to schemas
    (``properties``, ``definitions``, ...), never the maps themselves nor the data keywords;
    a node's own ``$schema`` sets the draft of its subtree."""
    if isinstance(node, list):
        return [_rewrite(v, visit, draft) for v in node]
    if not isinstance(node, dict):
        return node
    if isinstance(node.get("$schema"), str):
        draft = draft_of({"$schema": node["$schema"]}) or draft
    out = {}
    for key, value in node.items():
        if key in _DATA:
            out[key] = value
        elif key in _MAP_KEYWORDS and isinstance(value, dict):
            out[key] = {name: _rewrite(sub, visit, draft) for name, sub in value.items()}
        else:
            out[key] = _rewrite(value, visit, draft)
    return visit(out, draft)


#: The ``$schema`` URI llguidance knows for each draft's ``jsonschema`` validator class.
DRAFT_URIS = {
    "Draft3Validator": "http://json-schema.org/draft-03/schema#",
    "Draft4Validator": "http://json-schema.org/draft-04/schema#",
    "Draft6Validator": "http://json-schema.org/draft-06/schema#",
    "Draft7Validator": "http://json-schema.org/draft-07/schema#",
    "Draft201909Validator": "https://json-schema.org/draft/2019-09/schema",
    "Draft202012Validator": "https://json-schema.org/draft/2020-12/schema",
}


def ref_alone(schema: Any, draft: str) -> Any:
    """``schema`` read as its draft: each ``$schema`` the URI llguidance knows for the draft
    the final check reads (``jsonschema`` reads an unknown one, such as
    ``https://json-schema.org/draft-07/schema#``, as Draft 2020-12; llguidance would refuse
    it), and the siblings of each ``$ref`` dropped where the draft ignores them (drafts 3 to
    7), ``definitions`` / ``$defs`` kept."""

    def visit(node: dict, draft: str) -> dict:
        if isinstance(node.get("$schema"), str) and draft in DRAFT_URIS:
            node = {**node, "$schema": DRAFT_URIS[draft]}
        dialect = dialect_of(draft)
        if isinstance(node.get("$ref"), str) and dialect is not None and dialect.ref_alone:
            return {k: v for k, v in node.items() if k in _KEEP_BESIDE_REF}
        return node

    return _rewrite(schema, visit, draft)


def patterns_first(schema: Any) -> Any:
    """``schema`` with each node's ``patternProperties`` moved before its
    ``additionalProperties`` when an applicator stands between them (module docstring)."""

    def visit(node: dict, draft: str) -> dict:
        keys = list(node)
        if "patternProperties" not in node or "additionalProperties" not in node:
            return node
        extra, patterns = keys.index("additionalProperties"), keys.index("patternProperties")
        if patterns < extra or not any(k in _APPLICATORS for k in keys[extra:patterns]):
            return node
        keys.remove("patternProperties")
        keys.insert(extra, "patternProperties")
        return {k: node[k] for k in keys}

    return _rewrite(schema, visit, "")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def open_numbers(schema: Any, draft: str) -> Any:
    """``schema`` whose numbers may take any JSON spelling (module docstring)."""

    def visit(node: dict, draft: str) -> dict:
        out = {k: v for k, v in node.items() if k not in _NUMERIC}
        kind = out.get("type")
        if draft in _INTEGER_IS_NUMBER and kind is not None:
            kinds = kind if isinstance(kind, list) else [kind]
            kinds = list(dict.fromkeys("number" if k == "integer" else k for k in kinds))
            out["type"] = kinds if isinstance(kind, list) else kinds[0]
        if "const" in out and _is_number(out["const"]):
            out = _replace(out, "const", {"type": "number"})
        if isinstance(out.get("enum"), list) and any(_is_number(v) for v in out["enum"]):
            others = [v for v in out["enum"] if not _is_number(v)]
            number = {"type": "number"}
            out = _replace(out, "enum", {"anyOf": [{"enum": others}, number]} if others else number)
        return out

    return _rewrite(schema, visit, draft)


def _replace(node: dict, key: str, schema: dict) -> dict:
    """``node`` with the keyword ``key`` replaced by the subschema ``schema`` as a conjunct (in
    its place as ``allOf``, or added to the node's ``allOf``)."""
    if "allOf" not in node:
        return {
            ("allOf" if k == key else k): ([schema] if k == key else v) for k, v in node.items()
        }
    out = {k: v for k, v in node.items() if k != key}
    out["allOf"] = [*out["allOf"], schema] if isinstance(out["allOf"], list) else [schema]
    return out


_META = "\\.+*?()|[]{}^$#&-~"


def exact_name(name: str) -> str:
    """The regular expression that matches the key ``name`` alone."""
    return "^" + "".join("\\" + c if c in _META else c for c in name) + "$"


def _matches(pattern: Any, name: str) -> bool:
    try:
        return regex.search(pattern, name) is not None
    except (regex.error, TypeError):
        return True  # a pattern we cannot read may match: the name falls under it


def any_key_order(schema: Any, draft: str) -> Any:
    """``schema`` whose objects take their keys in any order (module docstring)."""
    prefix_items = draft == "Draft202012Validator"

    def visit(node: dict, draft: str) -> dict:
        out = dict(node)
        out.pop("required", None)
        props = out.pop("properties", None)
        if isinstance(props, dict):
            existing = out.get("patternProperties")
            existing = existing if isinstance(existing, dict) else {}
            named = {
                exact_name(name): sub
                for name, sub in props.items()
                if not any(_matches(p, name) for p in existing)
            }
            out["patternProperties"] = {**named, **existing}
        if "const" in out and _has_object(out["const"]):
            out = _replace(out, "const", _value_schema(out["const"], prefix_items))
        if isinstance(out.get("enum"), list) and any(_has_object(v) for v in out["enum"]):
            branches = [_value_schema(v, prefix_items) for v in out["enum"]]
            out = _replace(out, "enum", {"anyOf": branches})
        # the plain keywords first: llguidance reads additionalProperties with the patterns
        # beside it only if they come before the node's first applicator
        plain = {k: v for k, v in out.items() if k not in _APPLICATORS}
        return {**plain, **{k: v for k, v in out.items() if k in _APPLICATORS}}

    return _rewrite(schema, visit, draft)


def _has_object(value: Any) -> bool:
    if isinstance(value, dict):
        return True
    return isinstance(value, list) and any(_has_object(v) for v in value)


def _value_schema(value: Any, prefix_items: bool) -> dict:
    """A schema for the JSON value ``value`` whose objects take their keys in any order (a
    superset: a key may be left out; the final check compares the value itself)."""
    if isinstance(value, dict):
        return {
            "type": "object",
            "patternProperties": {
                exact_name(k): _value_schema(v, prefix_items) for k, v in value.items()
            },
            "additionalProperties": False,
        }
    if isinstance(value, list) and _has_object(value):
        items = [_value_schema(v, prefix_items) for v in value]
        tuple_keys = (
            {"prefixItems": items, "items": False}
            if prefix_items
            else {
                "items": items,
                "additionalItems": False,
            }
        )
        return {"type": "array", **tuple_keys, "minItems": len(value)}
    return {"const": value}


def without_min_properties(schema: Any) -> Any:
    """``schema`` without any ``minProperties`` (a larger language)."""

    def visit(node: dict, draft: str) -> dict:
        return {k: v for k, v in node.items() if k != "minProperties"}

    return _rewrite(schema, visit, "")
