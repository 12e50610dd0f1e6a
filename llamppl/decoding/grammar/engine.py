"""Adapter over the ``llguidance`` grammar engine: grammars, tokenizers, matchers, batched masks.

The facade of three layers, whose names it re-exports: :mod:`~llamppl.decoding.grammar.matcher`
(tokenizers and one particle's matcher), :mod:`~llamppl.decoding.grammar.masks` (the batched
masks) and :mod:`~llamppl.decoding.grammar.compile` (:class:`Grammar`, a constraint of the
protocol of :mod:`~llamppl.decoding.constraints.protocol`); :func:`make_grammar` is its own.

With ``grammar_compile``, the only modules importing ``llguidance`` (optional:
``pip install 'llamppl[grammar]'``; imported lazily). It offers:

- :class:`Grammar` (:mod:`~llamppl.decoding.grammar.compile`) — a compiled grammar from
  a JSON Schema, a regex or a Lark grammar (``ValueError`` quoting the engine);
- :func:`ll_tokenizer` — the llguidance tokenizer of an LM, built once per LM: from
  the HF fast tokenizer of a :class:`~llamppl.CachedCausalLM`
  (``llguidance.hf.from_tokenizer``) or, for :class:`~llamppl.FunctionLM` and other
  small LMs, from the list of token byte strings;
- :class:`MatcherState` — one particle's matcher (``llguidance.LLMatcher``), cloned
  with ``deep_copy()`` when the particle is cloned (``copy.deepcopy``); the first
  matcher of a grammar is built once per (grammar, LM) and copied after that;
- :func:`allowed_masks` — the masks of many matchers at once: particles in the same
  matcher state (clones after resampling) share one row; one llguidance call fills a
  ``(U, ⌈V/32⌉)`` int32 bitmask for the U distinct states, one tensor operation on the
  LM's device unpacks it, with EOS allowed exactly when a matcher accepts;
- :func:`apply_masks` — masks applied to a ``(B, V)`` batch of next-token
  log-probabilities with one multiplication: masked probabilities and allowed masses;
- :class:`MaskBatcher` — coalesces the concurrent mask requests of all particles
  in an SMC step into one :func:`apply_masks` (or :func:`allowed_masks`) call (same scheme as
  :meth:`llamppl.lm.base.LanguageModel.next_token_logprobs`).

Why llguidance: it compiles JSON Schema, regex and Lark to one matcher type,
builds from an HF tokenizer, and computes a 49,152-token mask in about 0.1 ms on
this CPU (``benchmarks/bench_structured.py`` measures the share of an SMC step)::

    from llamppl.decoding.grammar.engine import Grammar, MatcherState
    grammar = Grammar.from_regex("(ab|b)+c")
    state = MatcherState(lm, grammar)
    masks = allowed_masks(lm, [state])          # (1, V) bool
"""

from __future__ import annotations

from typing import Any

from llamppl.decoding.grammar.compile import Grammar
from llamppl.decoding.grammar.json_budget import JSONBudget, as_budget
from llamppl.decoding.grammar.masks import (
    MaskBatcher,
    allowed_masks,
    apply_masks,
    forced_token,
    mask_batcher,
)
from llamppl.decoding.grammar.matcher import MatcherState, ll_tokenizer

__all__ = [
    "Grammar",
    "MatcherState",
    "MaskBatcher",
    "allowed_masks",
    "apply_masks",
    "forced_token",
    "ll_tokenizer",
    "make_grammar",
    "mask_batcher",
]


def make_grammar(
    grammar: Grammar | None = None,
    *,
    json_schema: Any = None,
    regex: str | None = None,
    lark: str | None = None,
    budget: JSONBudget | None = None,
) -> Grammar:
    """A :class:`Grammar` from exactly one of ``grammar``, ``json_schema``, ``regex``, ``lark``.

    The JSON budget ``budget=`` (a :class:`~llamppl.decoding.grammar.json_budget.JSONBudget`;
    None: the default) applies to ``json_schema``
    (:func:`~llamppl.decoding.grammar.compile.json_grammar`).
    """
    budget = as_budget(budget)
    given = {
        k: v
        for k, v in (
            ("grammar", grammar),
            ("json_schema", json_schema),
            ("regex", regex),
            ("lark", lark),
        )
        if v is not None
    }
    if len(given) != 1:
        raise ValueError(
            "give exactly one of grammar=, json_schema=, regex=, lark= "
            f"(got {sorted(given) or 'none'})"
        )
    ((kind, value),) = given.items()
    if kind == "grammar":
        if not isinstance(value, Grammar):
            raise TypeError(
                "grammar must be a Grammar (use json_schema=, regex= or lark= for sources), "
                f"got {type(value).__name__}"
            )
        return value
    if kind == "json_schema":
        return Grammar.from_json_schema(value, budget=budget)
    return {
        "regex": Grammar.from_regex,
        "lark": Grammar.from_lark,
    }[kind](value)
