"""``Grammar``: a grammar compiled for llguidance, as a constraint of the protocol.

:class:`Grammar` holds the grammar string llguidance compiles (``spec``) and, for a JSON
Schema, the final check and what the tiers of :mod:`~llamppl.decoding.grammar.compile`
dropped. It answers the constraint protocol of
:mod:`~llamppl.decoding.constraints.protocol` with one particle's matcher as the state
(:mod:`~llamppl.decoding.grammar.matcher`) and llguidance's batched masks
(:mod:`~llamppl.decoding.grammar.masks`), and judges texts without an LM
(:mod:`~llamppl.decoding.grammar.strings`). Build one with ``Grammar.from_json_schema``,
``from_regex`` or ``from_lark`` (all re-exported by :mod:`llamppl.constraints`)::

    g = Grammar.from_regex("(ab|b)+c")
    g.accepts_prefix("abb"), g.accepts_end("abbc")   # (True, True)
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from llamppl.decoding.constraints.protocol import Constraint, ConstraintFailure
from llamppl.decoding.grammar.json_budget import JSONBudget
from llamppl.decoding.grammar.json_check import SchemaCheck
from llamppl.decoding.grammar.json_order import order_keys
from llamppl.decoding.grammar.json_patterns import JSONStringPatterns
from llamppl.decoding.grammar.masks import allowed_masks, apply_masks, forced_token
from llamppl.decoding.grammar.matcher import MatcherState, require_llguidance
from llamppl.decoding.grammar.native_stack import on_native_stack
from llamppl.decoding.grammar.strings import walk_text
from llamppl.lm.base import LanguageModel

__all__ = ["DEFAULT_COMPILE_TIMEOUT", "Grammar", "engine_error", "validate"]

#: Default bound on compiling one JSON Schema (every tier), in seconds: under 10 s with the
#: schema's reading and hashing (about a second for an 11 MB schema) added.
DEFAULT_COMPILE_TIMEOUT = 8.0


def validate(spec: str) -> tuple[str | None, list[str]]:
    """(llguidance's error for a grammar string or None if it compiles, its warnings)."""
    llg = require_llguidance()
    # llguidance's default limits: the tiers of a JSON Schema are chosen with them (a grammar
    # "too big" for them falls to a smaller tier), matchers then get ENGINE_LIMITS' fuel
    failed, messages = llg.LLMatcher.validate_grammar_with_warnings(spec)
    if failed:
        return (messages[0].strip() if messages else "invalid grammar"), []
    return None, list(messages)


def engine_error(spec: str) -> str | None:
    """llguidance's error for a grammar string, or None if it compiles (warnings allowed)."""
    return validate(spec)[0]


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
    compiled : Any
        For JSON Schemas: the schema llguidance compiled (budget, draft, spellings and
        tier applied), which fixes the key order (:meth:`order_keys`).

    ``validated=True`` skips the validation of ``spec`` at construction (the JSON Schema
    tiers of :mod:`~llamppl.decoding.grammar.compile` have validated it).

    String verdicts (no LM): ``accepts_prefix(text)`` (``grammar(text)`` too) says whether
    ``text`` is a prefix of the grammar's language, ``accepts_end(text)`` whether it is a
    sentence that passes the final check, by the engine's walk of the text's bytes
    (:mod:`~llamppl.decoding.grammar.strings`, a fresh matcher each time), the verdicts of
    the token-level walk with any LM. The prefix verdict is the engine's: where the grammar
    is a relaxed superset, a prefix may pass it that no valid text extends, which only the
    final check refuses, at the end; the :attr:`prefix_checks` are a constraint of their
    own (``grammar & grammar.prefix_checks`` judges with both, as ``GrammarConstraint``
    walks)::

        g = Grammar.from_json_schema({"type": "object", "properties": {"n": {"type": "integer"}}})
        g.accepts_prefix('{"n":1'), g.accepts_end('{"n":1}'), g.accepts_end('{"n":"1"}')
        # (True, True, False)
    """

    def __init__(
        self,
        kind: str,
        source: Any,
        spec: str,
        check: SchemaCheck | None = None,
        relaxed: tuple[str, ...] = (),
        prefix_checks: JSONStringPatterns | None = None,
        compiled: Any = None,
        validated: bool = False,
    ) -> None:
        if not validated:  # (the JSON Schema tiers validated their spec already)
            error = on_native_stack(partial(engine_error, spec))  # a plain call on a worker
            if error:
                raise ValueError(f"invalid {kind}: llguidance says: {error}")
        self.kind, self.source, self.spec = kind, source, spec
        self.check, self.relaxed = check, tuple(relaxed)
        self.prefix_checks = prefix_checks
        self.compiled = compiled

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
        from llamppl.decoding.grammar.compile import json_grammar  # the tiers build Grammars

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

    # ------------------------------------------------------------ string verdicts
    def __call__(self, text: str) -> bool:
        """The prefix check of ``text`` (:meth:`accepts_prefix`)."""
        return self.accepts_prefix(text)

    def accepts_prefix(self, text: str) -> bool:
        """Whether ``text`` is a prefix of a sentence of the grammar (class docstring)."""
        return walk_text(self.spec, text).prefix

    def accepts_end(self, text: str) -> bool:
        """Whether ``text`` is a sentence of the grammar and passes the final check."""
        if not walk_text(self.spec, text).sentence:
            return False
        return self.check is None or self.check(text)

    def order_keys(self, value: Any) -> Any:
        """``value`` (a JSON value) with every object's keys in the order this grammar writes
        them (:mod:`~llamppl.decoding.grammar.json_order`; as given for ``key_order="any"``,
        a regex or a Lark grammar): ``json.dumps(grammar.order_keys(value))`` is a text it
        accepts when ``value`` is valid."""
        if self.kind != "json_schema" or self.compiled is None:
            return value
        draft = self.check.draft if self.check is not None else None
        return order_keys(self.compiled, value, draft)

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
