"""Grammars and JSON Schema (``llamppl.decoding.grammar``), on the llguidance engine.

- :mod:`~llamppl.decoding.grammar.compile` — JSON Schema compilation tiers, cache and time
  bound; :mod:`~llamppl.decoding.grammar.constraint` — :class:`Grammar`
  (``from_json_schema``, ``from_regex``, ``from_lark``) as a constraint;
  :mod:`~llamppl.decoding.grammar.strings` — its verdicts on texts without an LM;
- :mod:`~llamppl.decoding.grammar.engine`, :mod:`~llamppl.decoding.grammar.matcher`,
  :mod:`~llamppl.decoding.grammar.masks` — the llguidance adapter: matchers owned by
  particles, batched masks;
- :mod:`~llamppl.decoding.grammar.logits` — the local-masking HF ``LogitsProcessor``;
- :mod:`~llamppl.decoding.grammar.json_budget`, :mod:`~llamppl.decoding.grammar.json_forms`,
  :mod:`~llamppl.decoding.grammar.json_order`, :mod:`~llamppl.decoding.grammar.json_check`,
  :mod:`~llamppl.decoding.grammar.json_formats`, :mod:`~llamppl.decoding.grammar.json_relax`,
  :mod:`~llamppl.decoding.grammar.json_patterns` — JSON Schema's size budget, spellings
  (draft, numbers, key order) and key order stated, exact validity check and its formats,
  relaxed tiers and dropped patterns;
- :mod:`~llamppl.decoding.grammar.native_stack` — large-stack workers for the engine's
  recursion.

Users import grammars from :mod:`llamppl.constraints`::

    from llamppl.decoding.grammar import Grammar
"""

from llamppl.decoding.grammar.compile import CompileTimeout, Grammar, json_grammar

__all__ = ["CompileTimeout", "Grammar", "json_grammar"]
