"""Token-level decoding kernels (``llamppl.decoding``): the parts that act on next-token
distributions but are not programs.

- :mod:`~llamppl.decoding.constraints.protocol` — the constraint protocol (prefix check, complete
  check, optional batched mask, optional state) and its composition ``&``;
  :mod:`~llamppl.decoding.text.characters` — ready-made text constraints with vectorised
  next-token masks (``max_word_length``, ``banned_words``, ``regex_prefix``);
- :mod:`~llamppl.decoding.proposals.lazy` — adaptive weighted rejection sampling: a lazy,
  exact token proposal that checks only the tokens it draws;
  :mod:`~llamppl.decoding.constraints.time_bound` — the time bound on every check;
- :mod:`~llamppl.decoding.grammar.compile`, :mod:`~llamppl.decoding.grammar.json_budget` and
  :mod:`~llamppl.decoding.grammar.json_check` — JSON Schema compilation (exact and relaxed tiers,
  cache), the size budget (short strings and arrays, closed objects) and the exact
  validity check;
- :mod:`~llamppl.decoding.grammar.engine` — the llguidance adapter (JSON Schema, regex,
  Lark): grammars, matchers, batched masks;
- :mod:`~llamppl.decoding.grammar.logits` — the local-masking HF ``LogitsProcessor``;
- :mod:`~llamppl.decoding.text.units` — characters, words, sentences and paragraphs split
  exactly as COLLIE's NLTK-based judge splits them, and
  :mod:`~llamppl.decoding.text.finality` — which units of a prefix are final (both need
  the ``collie`` extra);
- :mod:`~llamppl.decoding.text.builders` — constraints on those units, exact on prefixes
  (counts, positions, first/last words of sentences, last sentences of paragraphs, words
  present or absent), built from :mod:`~llamppl.decoding.text.counts`,
  :mod:`~llamppl.decoding.text.positions`, :mod:`~llamppl.decoding.text.presence` over the
  prefix analysis :mod:`~llamppl.decoding.text.prefix` and the token-budget facts of
  :mod:`~llamppl.decoding.text.budget`;
- :mod:`~llamppl.decoding.power_law.sampler` and :mod:`~llamppl.decoding.power_law.proposal` —
  the power-law token sampler and its use as an exact SMC proposal.

This floor sits above the DSL (it may import ``llamppl.context``, ``llamppl.lm``) and below
the engines and the library programs, which re-export its public names (the old
``llamppl.models`` spellings keep working)::

    from llamppl.decoding import max_word_length, PowerLawSampler
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from llamppl import lazy_exports
from llamppl.decoding.constraints.protocol import (
    AllOf,
    Constraint,
    ConstraintFailure,
    PredicateConstraint,
    as_constraint,
)
from llamppl.decoding.constraints.time_bound import CheckTimeout, time_bound
from llamppl.decoding.grammar.compile import CompileTimeout
from llamppl.decoding.power_law.proposal import PowerLawProposal, power_law_history
from llamppl.decoding.text.characters import banned_words, max_word_length, regex_prefix

if _TYPE_CHECKING:  # for type checkers and the docs; at run time: __getattr__ below
    from llamppl.decoding.power_law.sampler import PRESETS as POWER_LAW_PRESETS
    from llamppl.decoding.power_law.sampler import PowerLawDraw, PowerLawSampler

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

# The sampler is a transformers LogitsProcessor: imported when first looked up, so that
# constraints and proposals do not load transformers (see llamppl.lazy_exports)
__getattr__, __dir__ = lazy_exports.lazy_exports(
    globals(),
    {
        "PowerLawSampler": "llamppl.decoding.power_law.sampler:PowerLawSampler",
        "PowerLawDraw": "llamppl.decoding.power_law.sampler:PowerLawDraw",
        "POWER_LAW_PRESETS": "llamppl.decoding.power_law.sampler:PRESETS",
    },
)
