"""Compiling grammars for llguidance: :class:`Grammar` from a JSON Schema, a regex or a Lark grammar.

JSON Schemas compile in up to four tiers (``Grammar.from_json_schema``):

1. **exact** — llguidance's own compiler, compact by default (no free whitespace
   between tokens: ``{"a":1,"b":[2,3]}``; ``budget=JSONBudget(whitespace="flexible")``
   allows JSON's whitespace where the grammar permits it);
2. **relaxed** — when llguidance refuses the schema (``oneOf``, an unknown
   ``format``, ``not``, ``dependencies``, ``if``/``then``/``else``, …), the same
   schema with llguidance's ``coerce_one_of`` (``oneOf`` read as ``anyOf``) and
   ``lenient`` (unknown keywords and formats ignored) options. Its language is a
   superset of the schema's valid texts; :attr:`Grammar.check` (full ``jsonschema``
   validation against the schema's own draft) is then the final potential that
   :class:`~llamppl.models.GrammarConstraint` applies at EOS, so the target stays the
   LM conditioned on validity;
3. **stripped** — when even that fails, the keywords llguidance cannot express are
   removed (:mod:`~llamppl.decoding.grammar.json_relax`: ``pattern``s with lookarounds or
   backreferences, such ``patternProperties``, the sibling keys of a circular ``$ref``),
   again a superset; the dropped patterns come back as a prefix check on the strings
   they apply to unconditionally (:attr:`Grammar.prefix_checks`, which
   ``GrammarConstraint`` composes with the grammar; the others are left to the final
   check);
4. **skeleton** — for schemas the engine finds too large: only the top-level ``type``.

An unsatisfiable schema or an unresolvable reference is refused at every tier (no superset
cures it).

A **size budget** (``budget=``, a :class:`~llamppl.decoding.grammar.json_budget.JSONBudget`:
free strings of at most ``max_string_length`` characters, free arrays of at most
``max_array_items`` items, free numbers of at most ``max_decimals`` decimals, objects with
only their listed keys) is part of the grammar, not of the check: the
target becomes the LM conditioned on validity *and* on that budget, a documented
sub-language sampled exactly, because a small LM inside a free string, array or
object (or a number) rarely closes it and every particle then dies at the token budget
(``docs/programs/structured.md`` argues the choice). A field set to ``None`` /
``closed_objects=False`` turns that part off.

Only such refusals raise ``ValueError``, quoting llguidance. Compiled grammars are cached per
schema and options (:func:`json_grammar`; :func:`clear_cache` forgets them).

Beside the budget, the schema given to llguidance reads ``$ref`` as the schema's draft does,
spells numbers in any JSON form under ``max_decimals=None`` and takes keys in the order
``key_order`` says (:mod:`~llamppl.decoding.grammar.json_forms`); llguidance lets a string
spell any character as ``\\uXXXX``.

The whole compile (every tier; not the reading and hashing of the schema for the cache)
is bounded in time (``compile_timeout``, default :data:`DEFAULT_COMPILE_TIMEOUT` seconds):
it runs on a worker thread with a large stack, which llguidance's compile needs for long
chains of references (:mod:`~llamppl.decoding.grammar.native_stack`; it releases the GIL but
cannot be interrupted), and past the bound the caller gets :class:`CompileTimeout` (a
``ValueError`` naming the schema's size and the bound) while the compile is abandoned: it
runs no further tier, and its result is never cached. A regex or Lark grammar is
validated on such a worker too::

    from llamppl.decoding.grammar.compile import Grammar
    g = Grammar.from_json_schema({"oneOf": [{"type": "integer"}, {"type": "string"}]})
    g.relaxed      # ('oneOf constraints are not supported. ...',)
    g.check('"a"') # True
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

from llamppl.decoding.constraints.time_bound import check_timeout_seconds
from llamppl.decoding.grammar.constraint import (
    DEFAULT_COMPILE_TIMEOUT,
    Grammar,
    engine_error,
    validate,
)
from llamppl.decoding.grammar.json_budget import (
    MAX_ARRAY_ITEMS,
    MAX_DECIMALS,
    MAX_STRING_LENGTH,
    WHITESPACE,
    JSONBudget,
    as_budget,
    cap_sizes,
)
from llamppl.decoding.grammar.json_check import SchemaCheck, normalize_schema
from llamppl.decoding.grammar.json_forms import grammar_schema, without_min_properties
from llamppl.decoding.grammar.json_patterns import JSONStringPatterns
from llamppl.decoding.grammar.json_relax import is_refusal, skeleton, strip_unsupported
from llamppl.decoding.grammar.matcher import require_llguidance
from llamppl.decoding.grammar.native_stack import NativeCall
from llamppl.decoding.grammar.strings import forget_kept

__all__ = [
    "Grammar",
    "CompileTimeout",
    "DEFAULT_COMPILE_TIMEOUT",
    "require_llguidance",
    "json_grammar",
    "clear_cache",
    "JSONBudget",
    "cap_sizes",
    "WHITESPACE",
    "MAX_STRING_LENGTH",
    "MAX_ARRAY_ITEMS",
    "MAX_DECIMALS",
]

_RELAX = {"coerce_one_of": True, "lenient": True}
#: Options of every JSON compile: a string may spell any character as ``\\uXXXX`` (as
#: ``json.dumps`` does by default), not only the control characters. llguidance knows the
#: option from 1.8 on; older releases (vLLM pins 1.7) compile without it (:func:`_escapes`).
_ESCAPES = {"json_allow_general_unicode_escapes": True}
#: llguidance's warning when its lenient reading of ``minProperties`` counts only the keys
#: beyond ``properties`` (a smaller language: :func:`~.json_forms.without_min_properties`).
_MIN_PROPERTIES_WARNING = "min/maxProperties only supported"
_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 256


class CompileTimeout(ValueError):
    """A JSON Schema did not compile within ``compile_timeout`` seconds."""


class _Abandoned(Exception):
    """Raised on a compile's worker thread when its caller stopped waiting for it."""


def _regex_ok(pattern: str) -> bool:
    """Whether llguidance parses ``pattern`` as a regular expression."""
    llg = require_llguidance()
    try:
        return engine_error(llg.LLMatcher.grammar_from_regex(pattern)) is None
    except (ValueError, TypeError):
        return False


class _Attempt(NamedTuple):
    """One compile: the grammar string (None if refused), llguidance's error, and the schema
    given to it."""

    spec: str | None
    error: str | None
    schema: Any


@functools.cache
def _escapes() -> dict:
    """:data:`_ESCAPES` when this llguidance knows the option, else ``{}`` (then only the
    escapes JSON requires, control characters included, are written as ``\\uXXXX``)."""
    llg = require_llguidance()
    try:
        spec = llg.LLMatcher.grammar_from_json_schema({"type": "string"}, overrides=_ESCAPES)
    except ValueError:
        return {}
    return _ESCAPES if validate(spec)[0] is None else {}


def _compile(schema: Any, options: dict, stop: threading.Event | None = None) -> _Attempt:
    """llguidance's compile of ``schema`` with ``options``; :class:`_Abandoned` instead once
    ``stop`` is set (the caller stopped waiting). A relaxed compile (``lenient`` in
    ``options``) whose reading of ``minProperties`` would refuse valid objects
    (:data:`_MIN_PROPERTIES_WARNING`) compiles again without ``minProperties``."""
    if stop is not None and stop.is_set():
        raise _Abandoned
    llg = require_llguidance()
    try:
        spec = llg.LLMatcher.grammar_from_json_schema(schema, overrides={**options, **_escapes()})
    except ValueError as exc:
        return _Attempt(None, str(exc).strip(), schema)
    error, warnings = validate(spec)
    if error is None and options.get("lenient"):
        if any(_MIN_PROPERTIES_WARNING in w for w in warnings):
            wider = without_min_properties(schema)
            if wider != schema:  # (a maxProperties alone is read as a superset: kept)
                return _compile(wider, options, stop)
    return _Attempt(None if error else spec, error, schema)


def _compile_tiers(
    schema: Any, options: dict, relax: bool, stop: threading.Event | None = None
) -> tuple[_Attempt, tuple[str, ...]]:
    """(the last compile, why the exact tier failed): exact tier, then relaxed if allowed."""
    attempt = _compile(schema, options, stop)
    reasons: tuple[str, ...] = ()
    if attempt.spec is None and relax:
        reasons = (attempt.error,)
        attempt = _compile(schema, {**options, **_RELAX}, stop)
    return attempt, reasons


def json_grammar(
    schema: Any,
    *,
    relax: bool = True,
    budget: JSONBudget | None = None,
    compile_timeout: float | None = DEFAULT_COMPILE_TIMEOUT,
) -> Grammar:
    """The (cached) :class:`Grammar` of a JSON Schema: exact tier, else relaxed tier.

    Parameters
    ----------
    schema : dict | str | type
        JSON Schema (dict or JSON text) or a pydantic v2 model class.
    relax : bool
        Fall back to the relaxed tier (module docstring) when the exact one fails.
    budget : JSONBudget | None
        The whitespace and size budget as one value
        (:class:`~llamppl.decoding.grammar.json_budget.JSONBudget`: ``whitespace``
        ``"compact"`` (no whitespace between JSON tokens: the LM cannot spend its budget on
        indentation) or ``"flexible"``; ``max_string_length`` and ``max_array_items``, the
        size budget of the module docstring; ``closed_objects``, objects that list
        ``properties`` get no other keys and a map's keys at most ``max_string_length``
        characters (:func:`~llamppl.decoding.grammar.json_budget.close_objects`, XGrammar's
        default ``strict_mode``); ``max_decimals``, decimals per free number and fewer than
        16 integer digits where a number has no bound; ``None`` in a field: unbounded).
        ``None``: :data:`~llamppl.decoding.grammar.json_budget.DEFAULT_BUDGET`.
    compile_timeout : float | None
        Seconds the whole compile (every tier) may take, default
        :data:`DEFAULT_COMPILE_TIMEOUT`; past it :class:`CompileTimeout` (a ``ValueError``
        naming the schema's size and the bound) and nothing is cached. ``None``: no bound.
        A cached grammar is returned at once whatever the bound.
    """
    budget = as_budget(budget)
    if not isinstance(relax, bool):
        raise TypeError(f"relax must be a bool, got {type(relax).__name__}")
    seconds = check_timeout_seconds("compile_timeout", compile_timeout)
    schema = normalize_schema(schema)
    text = json.dumps(schema, sort_keys=True, default=str)
    key = (text, budget, relax)
    grammar = _CACHE.get(key)
    if grammar is not None:
        _CACHE.move_to_end(key)
        return grammar
    grammar = _within(seconds, partial(_json_grammar, schema, budget, relax))
    if grammar is None:
        nodes, definitions = _schema_size(schema)
        raise CompileTimeout(
            f"json_schema did not compile within compile_timeout={seconds:g} s (a schema of "
            f"{nodes} nodes, {len(text)} bytes of JSON, {definitions} definitions); give a "
            "larger compile_timeout, None for no bound, or a smaller schema"
        )
    _CACHE[key] = grammar
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return grammar


def clear_cache() -> None:
    """Forget every compiled JSON Schema grammar (the next :func:`json_grammar` compiles again)
    and every kept byte matcher of the string verdicts
    (:func:`~llamppl.decoding.grammar.strings.forget_kept`)."""
    _CACHE.clear()
    forget_kept()


def _within(seconds: float | None, build: Callable[[threading.Event], Grammar]) -> Grammar | None:
    """``build(stop)``, or None once it has run ``seconds`` (``seconds=None``: no bound).

    ``build`` runs on a :class:`~llamppl.decoding.grammar.native_stack.NativeCall` worker, so the
    caller gets control back at the bound even inside llguidance's native compile (which
    releases the GIL); ``stop`` is then set and the abandoned ``build`` stops before its
    next engine call, its result dropped. ``build``'s own exceptions are raised in the
    caller.
    """
    stop = threading.Event()
    call = NativeCall(partial(build, stop), name="llamppl-schema-compile")
    if not call.wait(seconds):
        stop.set()
        return None
    return call.result()


def _json_grammar(
    schema: dict, budget: JSONBudget, relax: bool, stop: threading.Event | None = None
) -> Grammar:
    """The :class:`Grammar` of ``schema`` through the tiers (module docstring), uncached."""
    options = {"whitespace_flexible": budget.whitespace == "flexible"}
    check = SchemaCheck(schema)
    target = partial(grammar_schema, budget=budget, draft=check.draft)
    attempt, reasons = _compile_tiers(target(schema), options, relax, stop)
    if attempt.spec is None and budget.closed_objects:  # closing made it unsatisfiable
        attempt, reasons = _compile_tiers(target(schema, closed=False), options, relax, stop)
    error, patterns = attempt.error, None
    if attempt.spec is None and relax and not is_refusal(error):  # stripped tier, skeleton
        stripped, dropped = strip_unsupported(schema, _regex_ok, draft=check.draft)
        last = _compile(target(stripped, closed=False), {**options, **_RELAX}, stop)
        if last.spec is not None:
            attempt, reasons = last, reasons + (error,)
            patterns = JSONStringPatterns(dropped) if dropped else None
        elif not is_refusal(last.error):
            attempt = _compile(skeleton(schema), {**options, **_RELAX}, stop)
            reasons += (error, last.error) if attempt.spec is not None else ()
        error = error if attempt.spec is not None or not is_refusal(last.error) else last.error
    if attempt.spec is None:
        hint = (
            "; the schema exceeds the grammar engine's limits: fewer optional properties, or "
            "max_decimals=None (each bounded number adds lexer states), may help"
            if "too big" in str(error)
            else ""
        )
        raise ValueError(
            f"invalid json_schema: llguidance cannot express it{' even relaxed' if relax else ''}: "
            f"{error}{hint}"
        )
    return Grammar(
        "json_schema",
        schema,
        attempt.spec,
        check=check,
        relaxed=reasons,
        prefix_checks=patterns,
        compiled=attempt.schema,
        validated=True,
    )


def _schema_size(schema: Any) -> tuple[int, int]:
    """(nodes, definitions) of a JSON Schema: its JSON objects and arrays, and the entries of
    its ``$defs`` / ``definitions`` maps (at any depth)."""
    nodes = definitions = 0
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            nodes += 1
            for key, value in node.items():
                if key in ("$defs", "definitions") and isinstance(value, dict):
                    definitions += len(value)
                stack.append(value)
        elif isinstance(node, list):
            nodes += 1
            stack.extend(node)
    return nodes, definitions
