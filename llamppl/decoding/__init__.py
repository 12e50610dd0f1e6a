"""Token-level decoding kernels (``llamppl.decoding``): the parts that act on next-token
distributions but are not programs.

- :mod:`~llamppl.decoding.constraints` — the constraint protocol (prefix check, complete
  check, optional batched mask, optional state) and its composition ``&``;
  :mod:`~llamppl.decoding.text_constraints` — ready-made text constraints with vectorised
  next-token masks (``max_word_length``, ``banned_words``, ``regex_prefix``);
- :mod:`~llamppl.decoding.lazy_proposal` — adaptive weighted rejection sampling: a lazy,
  exact token proposal that checks only the tokens it draws;
  :mod:`~llamppl.decoding.time_bound` — the time bound on every check;
- :mod:`~llamppl.decoding.grammar_compile`, :mod:`~llamppl.decoding.schema_budget` and
  :mod:`~llamppl.decoding.json_check` — JSON Schema compilation (exact and relaxed tiers,
  cache), the size budget (short strings and arrays, closed objects) and the exact
  validity check;
- :mod:`~llamppl.decoding.grammar_engine` — the llguidance adapter (JSON Schema, regex,
  Lark): grammars, matchers, batched masks;
- :mod:`~llamppl.decoding.grammar_logits` — the local-masking HF ``LogitsProcessor``;
- :mod:`~llamppl.decoding.text_units` — characters, words, sentences and paragraphs split
  exactly as COLLIE's NLTK-based judge splits them, and
  :mod:`~llamppl.decoding.text_finality` — which units of a prefix are final (both need
  the ``collie`` extra);
- :mod:`~llamppl.decoding.text_structure` — constraints on those units, exact on prefixes
  (counts, positions, first/last words of sentences, last sentences of paragraphs, words
  present or absent), built from :mod:`~llamppl.decoding.text_counts`,
  :mod:`~llamppl.decoding.text_positions`, :mod:`~llamppl.decoding.text_presence` over the
  prefix analysis :mod:`~llamppl.decoding.text_prefix` and the token-budget facts of
  :mod:`~llamppl.decoding.text_budget`;
- :mod:`~llamppl.decoding.power_law` and :mod:`~llamppl.decoding.power_law_proposal` —
  the power-law token sampler and its use as an exact SMC proposal.

This floor sits above the DSL (it may import ``llamppl.context``, ``llamppl.lm``) and below
the engines and the library programs, which re-export its public names (the old
``llamppl.models`` spellings keep working)::

    from llamppl.decoding import max_word_length, PowerLawSampler
"""

from .constraints import AllOf, Constraint, ConstraintFailure, PredicateConstraint, as_constraint
from .grammar_compile import CompileTimeout
from .power_law import PRESETS as POWER_LAW_PRESETS
from .power_law import PowerLawDraw, PowerLawSampler
from .power_law_proposal import PowerLawProposal, power_law_history
from .text_constraints import banned_words, max_word_length, regex_prefix
from .time_bound import CheckTimeout, time_bound

__all__ = [
    "Constraint",
    "ConstraintFailure",
    "PredicateConstraint",
    "AllOf",
    "as_constraint",
    "CheckTimeout",
    "CompileTimeout",
    "time_bound",
    "banned_words",
    "max_word_length",
    "regex_prefix",
    "PowerLawSampler",
    "PowerLawDraw",
    "POWER_LAW_PRESETS",
    "PowerLawProposal",
    "power_law_history",
]
