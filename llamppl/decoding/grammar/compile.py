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

Only such refusals raise ``ValueError``, quoting llguidance. Compiled grammars are cached per schema and options
(:func:`json_grammar`).

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

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from llamppl.decoding.constraints.protocol import Constraint, ConstraintFailure
from llamppl.decoding.constraints.time_bound import check_timeout_seconds
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
from llamppl.decoding.grammar.json_patterns import JSONStringPatterns
from llamppl.decoding.grammar.json_relax import is_refusal, skeleton, strip_unsupported
from llamppl.decoding.grammar.masks import allowed_masks, apply_masks, forced_token
from llamppl.decoding.grammar.matcher import MatcherState, require_llguidance
from llamppl.decoding.grammar.native_stack import NativeCall, on_native_stack
from llamppl.lm.base import LanguageModel

__all__ = [
    "Grammar",
    "CompileTimeout",
    "DEFAULT_COMPILE_TIMEOUT",
    "require_llguidance",
    "json_grammar",
    "JSONBudget",
    "cap_sizes",
    "WHITESPACE",
    "MAX_STRING_LENGTH",
    "MAX_ARRAY_ITEMS",
    "MAX_DECIMALS",
]

_RELAX = {"coerce_one_of": True, "lenient": True}
_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 256
#: Default bound on compiling one JSON Schema (every tier), in seconds: under 10 s with the
#: schema's reading and hashing (about a second for an 11 MB schema) added.
DEFAULT_COMPILE_TIMEOUT = 8.0


class CompileTimeout(ValueError):
    """A JSON Schema did not compile within ``compile_timeout`` seconds."""


class _Abandoned(Exception):
    """Raised on a compile's worker thread when its caller stopped waiting for it."""


def _engine_error(spec: str) -> str | None:
    """llguidance's error for a grammar string, or None if it compiles (warnings allowed)."""
    message = require_llguidance().LLMatcher.validate_grammar(spec)
    if message and not message.startswith("WARNING"):
        return message.strip()
    return None


class Grammar(Constraint):
    """A grammar compiled for llguidance, validated at construction; a constraint.

    Build with :meth:`from_json_schema`, :meth:`from_regex` or :meth:`from_lark`. As a
    :class:`~llamppl.decoding.constraints.protocol.Constraint` its state is a
    :class:`~llamppl.decoding.grammar.matcher.MatcherState`: the prefix check asks the
    matcher whether a token may come next, the complete check is "the matcher accepts"
    and, for a JSON Schema, the full ``jsonschema`` check of the text (the final
    potential), and the batched mask is llguidance's (one engine call for all
    particles). ``grammar & predicate`` adds a Python check, for example on the values
    of a JSON object.

    Attributes
    ----------
    kind : str
        ``"json_schema"``, ``"regex"`` or ``"lark"`` (the argument it came from).
    source : Any
        The user's schema / pattern / grammar text.
    spec : str
        The llguidance grammar string given to ``LLMatcher``.
    check : SchemaCheck | None
        For JSON Schemas: full validation of a finished text (the final potential).
    relaxed : tuple[str, ...]
        Why the exact compiler refused the schema (empty when it compiled exactly).
    prefix_checks : JSONStringPatterns | None
        The string patterns the grammar dropped, as a prefix check on the JSON text.
    """

    def __init__(
        self,
        kind: str,
        source: Any,
        spec: str,
        check: SchemaCheck | None = None,
        relaxed: tuple[str, ...] = (),
        prefix_checks: JSONStringPatterns | None = None,
    ) -> None:
        error = on_native_stack(partial(_engine_error, spec))  # a plain call on a worker
        if error:
            raise ValueError(f"invalid {kind}: llguidance says: {error}")
        self.kind, self.source, self.spec = kind, source, spec
        self.check, self.relaxed = check, tuple(relaxed)
        self.prefix_checks = prefix_checks

    @classmethod
    def from_json_schema(
        cls,
        schema: Any,
        *,
        relax: bool = True,
        budget: JSONBudget | None = None,
        compile_timeout: float | None = DEFAULT_COMPILE_TIMEOUT,
    ) -> Grammar:
        """JSON Schema given as a dict, a JSON string, or a pydantic model class (cached);
        the whitespace and size budget as ``budget=`` (a
        :class:`~llamppl.decoding.grammar.json_budget.JSONBudget`, None: the default), the
        time bound as ``compile_timeout`` (:func:`json_grammar`)."""
        return json_grammar(schema, relax=relax, budget=budget, compile_timeout=compile_timeout)

    @classmethod
    def from_regex(cls, regex: str) -> Grammar:
        """A regular expression the whole generated text must match."""
        if not isinstance(regex, str):
            raise TypeError(f"regex must be a str, got {type(regex).__name__}")
        return cls("regex", regex, require_llguidance().LLMatcher.grammar_from_regex(regex))

    @classmethod
    def from_lark(cls, lark: str) -> Grammar:
        """A Lark grammar (llguidance dialect; the start rule is ``start``)."""
        if not isinstance(lark, str):
            raise TypeError(f"lark must be a str, got {type(lark).__name__}")
        return cls("lark", lark, require_llguidance().LLMatcher.grammar_from_lark(lark))

    # ------------------------------------------------------------ the constraint protocol
    cheap_mask = True

    def start(self, lm: LanguageModel) -> MatcherState:
        return MatcherState(lm, self)

    def allows(self, lm: LanguageModel, state: MatcherState, token: int) -> bool:
        return state.allows(token)

    def ends(self, lm: LanguageModel, state: MatcherState) -> bool:
        if not state.accepting:
            return False
        return self.check is None or self.check(lm.decode(state.consumed))

    def end_failure(self, lm: LanguageModel, state: MatcherState) -> str | None:
        """Why an accepting state may not end: the schema check's error (None otherwise)."""
        if state.accepting and self.check is not None and not self.check(lm.decode(state.consumed)):
            return f"schema check: {self.check.last_error}"
        return None

    def advance(self, lm: LanguageModel, state: MatcherState, token: int) -> MatcherState:
        if not state.consume(token):
            error = state.engine_error or "the engine rejected a token it allowed"
            raise ConstraintFailure(f"grammar engine: {error.splitlines()[0]}")
        return state

    def masks(self, lm: LanguageModel, states) -> torch.Tensor:
        return allowed_masks(lm, list(states))

    def masked_probs(self, lm, states, log_probs, ends, end_ids, final):
        """:func:`~llamppl.decoding.grammar.masks.apply_masks`: the bit-level fast path."""
        return apply_masks(lm, list(states), log_probs, final, ends=ends, end_ids=end_ids)

    def forced(self, lm: LanguageModel, state: MatcherState) -> int | None:
        return forced_token(state)

    def text_of(self, lm: LanguageModel, state: MatcherState) -> str:
        return lm.decode(state.consumed)

    def __deepcopy__(self, memo) -> Grammar:
        return self  # immutable: particles share it

    def __repr__(self) -> str:
        tier = ", relaxed" if self.relaxed else ""
        return f"Grammar({self.kind}={self.source!r}{tier})"


def _regex_ok(pattern: str) -> bool:
    """Whether llguidance parses ``pattern`` as a regular expression."""
    llg = require_llguidance()
    try:
        return _engine_error(llg.LLMatcher.grammar_from_regex(pattern)) is None
    except (ValueError, TypeError):
        return False


def _compile(
    schema: dict, options: dict, stop: threading.Event | None = None
) -> tuple[str | None, str | None]:
    """(spec, None) if llguidance compiles ``schema`` with ``options``, else (None, its message);
    :class:`_Abandoned` instead once ``stop`` is set (the caller stopped waiting)."""
    if stop is not None and stop.is_set():
        raise _Abandoned
    llg = require_llguidance()
    try:
        spec = llg.LLMatcher.grammar_from_json_schema(schema, overrides=options)
    except ValueError as exc:
        return None, str(exc).strip()
    error = _engine_error(spec)
    return (None, error) if error else (spec, None)


def _compile_tiers(
    schema: dict, options: dict, relax: bool, stop: threading.Event | None = None
) -> tuple[str | None, str | None, tuple[str, ...]]:
    """(spec, last error, why the exact tier failed): exact tier, then relaxed if allowed."""
    spec, error = _compile(schema, options, stop)
    reasons: tuple[str, ...] = ()
    if spec is None and relax:
        reasons = (error,)
        spec, error = _compile(schema, {**options, **_RELAX}, stop)
    return spec, error, reasons


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
    spec, error, reasons = _compile_tiers(budget.apply(schema), options, relax, stop)
    if spec is None and budget.closed_objects:  # closing made it unsatisfiable: the open budget
        spec, _, reasons = _compile_tiers(budget.apply(schema, closed=False), options, relax, stop)
    patterns = None
    if spec is None and relax and not is_refusal(error):  # the stripped tier, then the skeleton
        stripped, dropped = strip_unsupported(schema, _regex_ok, draft=check.draft)
        spec, last = _compile(budget.apply(stripped, closed=False), {**options, **_RELAX}, stop)
        if spec is not None:
            reasons += (error,)
            patterns = JSONStringPatterns(dropped) if dropped else None
        elif not is_refusal(last):
            spec, _ = _compile(skeleton(schema), {**options, **_RELAX}, stop)
            reasons += (error, last) if spec is not None else ()
        error = error if spec is not None or not is_refusal(last) else last
    if spec is None:
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
        spec,
        check=check,
        relaxed=reasons,
        prefix_checks=patterns,
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
