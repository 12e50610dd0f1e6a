"""JSON Schema inputs and the exact validity check of a finished text (``jsonschema``, own draft).

- :func:`normalize_schema` — a schema given as a dict, a JSON string or a pydantic model
  class, as a dict (``TypeError`` / ``ValueError`` naming ``json_schema`` otherwise);
- :class:`SchemaCheck` — ``check(text) -> bool``: the text parses as JSON (each object's
  keys written once: ``json.loads`` would keep the last of a repeated key silently) and
  validates against the schema with the validator of the schema's own ``$schema`` draft
  (Draft 2020-12 when it names none), every format the drafts define asserted
  (:mod:`~llamppl.decoding.grammar.json_formats`).
  It is the final potential of :class:`~llamppl.models.GrammarConstraint`: a finished
  particle whose text fails it gets weight zero, which keeps the target exact when the
  grammar is only a superset of the valid texts (a relaxed grammar)::

    from llamppl.decoding.grammar.json_check import SchemaCheck
    check = SchemaCheck({"oneOf": [{"maximum": 5}, {"minimum": 3}]})
    check("1"), check("4")   # (True, False): 4 matches both branches of oneOf
"""

from __future__ import annotations

import json
from typing import Any

from llamppl.decoding.grammar.json_formats import format_checker

__all__ = ["SchemaCheck", "normalize_schema"]


def _once(pairs: list[tuple[str, Any]]) -> dict:
    """An object from its ``(key, value)`` pairs; ``ValueError`` for a key written twice."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"the key {twice!r} is written twice in one object")
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def normalize_schema(schema: Any) -> dict:
    """``schema`` as a JSON Schema dict."""
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()  # pydantic v2 model class
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"json_schema is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise TypeError(
            "json_schema must be a dict, a JSON string or a pydantic model class, "
            f"got {type(schema).__name__}"
        )
    return schema


class SchemaCheck:
    """Exact validity of a JSON text against a schema (the final potential 1_valid).

    ``jsonschema`` is imported lazily (it ships with the ``grammar`` extra). A
    schema the validator cannot use (an unresolvable ``$ref``, a malformed keyword)
    makes every text fail the check, with the validator's message in
    :attr:`last_error`: nothing unchecked is ever returned as valid.
    """

    def __init__(self, schema: dict) -> None:
        import jsonschema
        from jsonschema.validators import validator_for

        self.schema = schema
        cls = validator_for(schema, default=jsonschema.Draft202012Validator)
        self.draft = cls.__name__
        self.validator = cls(schema, format_checker=format_checker())
        self.last_error: str | None = None

    def __call__(self, text: str) -> bool:
        """Whether ``text`` is one JSON value that validates against the schema."""
        try:
            value = json.loads(text, object_pairs_hook=_once, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            self.last_error = f"not JSON: {exc}"
            return False
        try:
            error = next(iter(self.validator.iter_errors(value)), None)
        except Exception as exc:  # noqa: BLE001 - an unusable schema fails closed
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False
        if error is not None:
            self.last_error = error.message
            return False
        return True

    def __deepcopy__(self, memo) -> SchemaCheck:
        return self  # stateless apart from the last message: shared by particles

    def __repr__(self) -> str:
        return f"SchemaCheck({self.draft})"
