"""The size budget of a JSON Schema: the sub-language the grammar is compiled from.

A small LM inside a free string, array or object rarely closes it, so every
particle dies at the token budget. :func:`budget_schema` returns the schema given to
llguidance (never the one the final ``jsonschema`` check uses), restricted to:

- **strings**: a free string (type ``string`` without ``maxLength``, ``pattern``,
  ``format``, ``enum`` or ``const``) gets ``maxLength = max(max_string_length,
  minLength)`` (:func:`cap_sizes`);
- **arrays**: a free array (no ``maxItems``) gets ``maxItems = max(max_array_items,
  minItems)`` (:func:`cap_sizes`);
- **numbers**: a free number (no ``multipleOf``, ``enum`` or ``const``) gets at most
  ``max_decimals`` decimals (``multipleOf = 10**-max_decimals``), and a number or
  integer with no bound on a side gets fewer than 16 integer digits there
  (:func:`cap_sizes`);
- **objects**: an object that lists its ``properties`` and says nothing about other
  keys gets only those keys; a map's free keys are at most ``max_string_length``
  characters (:func:`close_objects`); a free value (``{}`` where a property's or
  item's schema goes) is a scalar or an array or map of scalars
  (:func:`bound_free_values`).

Every text of the budgeted language that passes the original schema's check is
valid, so the target is the LM conditioned on validity *and* on this budget: a stated
sub-language, sampled exactly::

    budget_schema({"type": "object", "properties": {"a": {"type": "string"}}}, 32, 4)
    # {'type': 'object', 'properties': {'a': {'type': 'string', 'maxLength': 32}},
    #  'additionalProperties': False}

Two more settings say how values are *spelled*, beside their sizes (both part of the
target; :mod:`~llamppl.decoding.grammar.json_forms` applies them):

- **numbers**: with ``max_decimals`` set, a number is written in plain decimal notation
  (llguidance's forms: ``2`` for ``enum: [2.0]``, no exponent where a bound applies); with
  ``max_decimals=None`` every JSON spelling of an allowed number is in the target
  (``2.0``, ``1e-06``, ``1.0`` for an integer from Draft 6 on);
- **key order** (``key_order``): ``"schema"`` (the default), the order llguidance fixes
  for an object's keys (:mod:`~llamppl.decoding.grammar.json_order` states it exactly:
  ``properties`` in the schema's order, then the ``required`` names not listed, then any
  other key), or ``"any"``: any order, each key at most once.

The budget's settings, with the text's whitespace, form one hashable value,
:class:`JSONBudget` (the compiled-grammar cache's key), the one way every function that
compiles a schema takes them, as ``budget=`` (``None``: :data:`DEFAULT_BUDGET`;
:func:`as_budget` reads the argument)::

    budget = JSONBudget(max_string_length=64, max_array_items=8)
    generate_json(lm, prompt, schema, budget=budget)

The five separate keywords (``whitespace=``, ``max_string_length=``,
``max_array_items=``, ``closed_objects=``, ``max_decimals=``) are accepted too, as rows of
the compatibility table (:mod:`llamppl.compat`), which turns them into this value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llamppl.validation import is_integer

__all__ = [
    "JSONBudget",
    "DEFAULT_BUDGET",
    "as_budget",
    "WHITESPACE",
    "KEY_ORDERS",
    "budget_schema",
    "cap_sizes",
    "close_objects",
    "bound_free_values",
    "FREE_VALUE",
    "MAX_STRING_LENGTH",
    "MAX_ARRAY_ITEMS",
    "MAX_DECIMALS",
]

MAX_STRING_LENGTH = 32
MAX_ARRAY_ITEMS = 4
MAX_DECIMALS = 6
INTEGER_DIGITS = 15
WHITESPACE = ("compact", "flexible")
KEY_ORDERS = ("schema", "any")
_STRING_FIXED = ("maxLength", "pattern", "format", "enum", "const")
_ARRAY_FIXED = ("maxItems", "enum", "const", "prefixItems")


def _has_type(node: dict, name: str) -> bool:
    kind = node.get("type")
    return kind == name or (isinstance(kind, list) and name in kind)


def cap_sizes(
    node: Any, max_length: int | None, max_items: int | None, max_decimals: int | None = None
) -> Any:
    """A copy of a schema with the size budget: free strings get ``maxLength =
    max(max_length, minLength)``, free arrays ``maxItems = max(max_items, minItems)``,
    free numbers ``multipleOf = 10**-max_decimals``, and numbers and integers without
    a bound on a side get ``|x| <`` 10**:data:`INTEGER_DIGITS`."""
    if isinstance(node, list):
        return [cap_sizes(v, max_length, max_items, max_decimals) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: cap_sizes(v, max_length, max_items, max_decimals) for k, v in node.items()}
    for limit, name, low_key, fixed, high_key in (
        (max_length, "string", "minLength", _STRING_FIXED, "maxLength"),
        (max_items, "array", "minItems", _ARRAY_FIXED, "maxItems"),
    ):
        if limit is not None and _has_type(node, name) and not any(k in node for k in fixed):
            low = node.get(low_key, 0)
            out[high_key] = max(limit, low if isinstance(low, int) else 0)
    numeric = _has_type(node, "number") or _has_type(node, "integer")
    if max_decimals is not None and numeric and not any(k in node for k in ("enum", "const")):
        if _has_type(node, "number") and "multipleOf" not in node:
            out["multipleOf"] = 10.0**-max_decimals
        bound = 10**INTEGER_DIGITS - 1
        low, high = node.get("minimum"), node.get("maximum")
        if high is None and "exclusiveMaximum" not in node and (low is None or low <= bound):
            out["maximum"] = bound
        if low is None and "exclusiveMinimum" not in node and (high is None or high >= -bound):
            out["minimum"] = -bound
    return out


_CONJOINED = ("allOf", "if", "then", "else", "not", "dependentSchemas", "dependencies")
_UNIONS = ("anyOf", "oneOf")
_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_ANNOTATIONS = ("description", "title", "$comment", "default", "examples", "$schema", "$id", "id")


def _children(node: dict, conjoined: bool):
    """(key, child, child is conjoined) for each child schema of ``node`` (see close_objects)."""
    keywords = [k for k in node if k not in _ANNOTATIONS]
    union_only = all(k in _UNIONS for k in keywords)
    for k, v in node.items():
        yield k, v, conjoined or k in _CONJOINED or (k in _UNIONS and not union_only)


def _conjoined_refs(node: Any, shared: set[str], conjoined: bool = False) -> None:
    """Add to ``shared`` the local ``$ref`` targets used in a conjoined position."""
    if isinstance(node, list):
        for v in node:
            _conjoined_refs(v, shared, conjoined)
    elif isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and (conjoined or len(node) > 1):
            shared.add(ref)
        for key, child, inner in _children(node, conjoined):
            for defs in ("definitions", "$defs"):
                if key == defs and isinstance(child, dict):
                    for name, sub in child.items():
                        _conjoined_refs(sub, shared, inner or f"#/{defs}/{name}" in shared)
                    break
            else:
                _conjoined_refs(child, shared, inner)


def close_objects(node: Any, max_key_length: int | None) -> Any:
    """A copy of a schema with closed objects (the object part of the size budget).

    An object schema that lists ``properties`` and says nothing about other keys
    (no ``additionalProperties``, ``patternProperties`` or ``unevaluatedProperties``)
    gets ``additionalProperties: false``: only its listed keys, as XGrammar's default
    ``strict_mode`` does. A pure map (``type: object`` with no ``properties``) keeps
    free keys, of at most ``max_key_length`` characters (as ``patternProperties``).
    Schemas *conjoined* with others stay open, because closing one conjunct could
    exclude every valid object: everything under ``allOf``, ``if``/``then``/``else``,
    ``not``, dependencies, under ``anyOf``/``oneOf`` beside other keywords, nodes with a
    ``$ref`` beside other keywords, and local definitions referenced from such places.
    So do objects whose ``required`` or ``minProperties`` asks for unlisted keys.
    Every closed object is valid under the original schema, which the final check uses.
    """
    shared: set[str] = set()
    for _ in range(8):  # a shared definition's own references are shared too: fixpoint
        before = len(shared)
        _conjoined_refs(node, shared)
        if len(shared) == before:
            break
    return _close(node, max_key_length, shared, False)


def _close(node: Any, max_key_length: int | None, shared: set[str], conjoined: bool) -> Any:
    if isinstance(node, list):
        return [_close(v, max_key_length, shared, conjoined) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, child, inner in _children(node, conjoined):
        if key in ("definitions", "$defs") and isinstance(child, dict):
            out[key] = {
                name: _close(sub, max_key_length, shared, inner or f"#/{key}/{name}" in shared)
                for name, sub in child.items()
            }
        else:
            out[key] = _close(child, max_key_length, shared, inner)
    if conjoined or any(k in node for k in ("$ref", *_CONJOINED, *_UNIONS, *_OPEN_KEYS[1:])):
        return out
    props, required = node.get("properties"), node.get("required", [])
    extra = out.get("additionalProperties", True)
    if isinstance(props, dict):
        if "additionalProperties" not in node and isinstance(required, list):
            if set(required) <= set(props) and "minProperties" not in node:
                out["additionalProperties"] = False
    elif _has_type(node, "object") and max_key_length is not None and extra is not False:
        if not any(k in node for k in ("minProperties", "required", "propertyNames")):
            out["patternProperties"] = {
                f"^.{{0,{max_key_length}}}$": {} if extra is True else extra
            }
            out["additionalProperties"] = False
    return out


_SCALAR = {"anyOf": [{"type": t} for t in ("string", "number", "boolean", "null")]}
FREE_VALUE = {
    "anyOf": [
        *_SCALAR["anyOf"],
        {"type": "array", "items": _SCALAR},
        {"type": "object", "additionalProperties": _SCALAR},
    ]
}
"""What a free value (``{}`` or ``true`` where a value's schema goes) becomes in the
budget: a scalar, or an array or map of scalars (capped like any other)."""
_VALUE_LISTS = ("prefixItems",)
_VALUE_MAPS = ("properties", "patternProperties")
_VALUE_SLOTS = ("items", "additionalProperties")


def _free(node: Any) -> bool:
    return node is True or (isinstance(node, dict) and all(k in _ANNOTATIONS for k in node))


def bound_free_values(node: Any) -> Any:
    """A copy of a schema whose free values (``{}`` or ``true`` as the schema of a
    property, an item or an additional property) are :data:`FREE_VALUE`: any JSON
    would let a small LM nest or extend without end."""
    if isinstance(node, list):
        return [bound_free_values(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, child in node.items():
        if key in _VALUE_SLOTS and _free(child):
            out[key] = FREE_VALUE
        elif key in _VALUE_MAPS and isinstance(child, dict):
            out[key] = {
                k: FREE_VALUE if _free(v) else bound_free_values(v) for k, v in child.items()
            }
        elif key in _VALUE_LISTS and isinstance(child, list):
            out[key] = [FREE_VALUE if _free(v) else bound_free_values(v) for v in child]
        else:
            out[key] = bound_free_values(child)
    return out


def budget_schema(
    schema: Any,
    max_string_length: int | None,
    max_array_items: int | None,
    closed: bool = True,
    max_decimals: int | None = None,
) -> Any:
    """The schema llguidance compiles: :func:`bound_free_values` and :func:`close_objects`
    (if ``closed``), then :func:`cap_sizes`."""
    if closed:
        schema = close_objects(bound_free_values(schema), max_string_length)
    return cap_sizes(schema, max_string_length, max_array_items, max_decimals)


def _check_size(name: str, value: Any) -> None:
    if value is not None and (not is_integer(value) or value < 1):
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")


@dataclass(frozen=True)
class JSONBudget:
    """The sub-language a JSON Schema is compiled to, as one hashable value.

    Attributes
    ----------
    whitespace : {"compact", "flexible"}
        ``"compact"``: no whitespace between JSON tokens (the LM cannot spend its token
        budget on indentation); ``"flexible"``: JSON's free whitespace.
    max_string_length, max_array_items : int | None
        Characters per free string and items per free array (module docstring);
        ``None``: unbounded.
    closed_objects : bool
        Objects that list ``properties`` get only those keys, and a map's keys at most
        ``max_string_length`` characters (XGrammar's default ``strict_mode``); ``False``:
        JSON Schema's open objects.
    max_decimals : int | None
        Decimals per free number, and fewer than 16 integer digits where a number has
        no bound, numbers written in plain decimal notation; ``None``: unbounded, and any
        JSON spelling of an allowed number (module docstring).
    key_order : {"schema", "any"}
        The order of an object's keys: ``"schema"``, the order the grammar engine fixes
        (:mod:`~llamppl.decoding.grammar.json_order`), or ``"any"``.
    """

    whitespace: str = "compact"
    max_string_length: int | None = MAX_STRING_LENGTH
    max_array_items: int | None = MAX_ARRAY_ITEMS
    closed_objects: bool = True
    max_decimals: int | None = MAX_DECIMALS
    key_order: str = "schema"

    def __post_init__(self) -> None:
        if self.whitespace not in WHITESPACE:
            raise ValueError(f"whitespace must be one of {WHITESPACE}, got {self.whitespace!r}")
        if self.key_order not in KEY_ORDERS:
            raise ValueError(f"key_order must be one of {KEY_ORDERS}, got {self.key_order!r}")
        if not isinstance(self.closed_objects, bool):
            raise TypeError(
                f"closed_objects must be a bool, got {type(self.closed_objects).__name__}"
            )
        _check_size("max_string_length", self.max_string_length)
        _check_size("max_array_items", self.max_array_items)
        _check_size("max_decimals", self.max_decimals)

    def apply(self, schema: Any, closed: bool | None = None) -> Any:
        """:func:`budget_schema` of ``schema`` under this budget (``closed`` overrides
        ``closed_objects``)."""
        closed = self.closed_objects if closed is None else closed
        return budget_schema(
            schema, self.max_string_length, self.max_array_items, closed, self.max_decimals
        )


DEFAULT_BUDGET = JSONBudget()
"""The budget ``budget=None`` means: compact whitespace, 32 characters per free string, 4
items per free array, closed objects, 6 decimals per free number, keys in the schema's order."""


def as_budget(budget: JSONBudget | None) -> JSONBudget:
    """The budget a ``budget=`` argument asks for: :data:`DEFAULT_BUDGET` for ``None``, a
    :class:`JSONBudget` itself, else ``TypeError`` naming ``budget``."""
    if budget is None:
        return DEFAULT_BUDGET
    if not isinstance(budget, JSONBudget):
        raise TypeError(f"budget must be a JSONBudget or None, got {type(budget).__name__}")
    return budget
