"""Library programs of llamppl (``llamppl.models``): ready-made ``Model`` subclasses and the
drivers of the seed papers (``power_smc``, ``speculative_smc``, ``specs``, ``generate_json``).

The token-level kernels they use live one floor down in :mod:`llamppl.decoding`; their public
names are re-exported here. Their old module paths (``llamppl.models.constraints``,
``.power_law``, ...) are rows of the compatibility table (:mod:`llamppl.compat`) and import
as the ``llamppl.decoding`` modules.
"""

from llamppl.decoding.constraints import Constraint
from llamppl.decoding.grammar_engine import Grammar, make_grammar
from llamppl.decoding.grammar_logits import GrammarLogitsProcessor
from llamppl.decoding.power_law import PRESETS as POWER_LAW_PRESETS
from llamppl.decoding.power_law import PowerLawDraw, PowerLawSampler
from llamppl.decoding.power_law_proposal import PowerLawProposal, power_law_history
from llamppl.decoding.text_constraints import banned_words, max_word_length, regex_prefix

from .drafts import draft_from_layers, skip_middle_draft, truncated_draft
from .generation import Generation
from .grammar import GrammarConstraint
from .hard_constraints import HardConstraint
from .infilling import Infilling
from .mh_power import mh_power_sampling
from .power_sampling import PowerSampling, low_temperature_decode, power_smc
from .prompt_intersection import PromptIntersection
from .specs import beam_search, specs
from .speculative import SpeculativeDecoding, SpeculativeResult, speculative_smc
from .structured import StructuredResult, generate_json

__all__ = [
    "specs",
    "beam_search",
    "PowerLawSampler",
    "PowerLawProposal",
    "PowerLawDraw",
    "POWER_LAW_PRESETS",
    "power_law_history",
    "Constraint",
    "HardConstraint",
    "Infilling",
    "PromptIntersection",
    "banned_words",
    "max_word_length",
    "regex_prefix",
    "PowerSampling",
    "power_smc",
    "low_temperature_decode",
    "mh_power_sampling",
    "SpeculativeDecoding",
    "SpeculativeResult",
    "speculative_smc",
    "truncated_draft",
    "skip_middle_draft",
    "draft_from_layers",
    "Generation",
    "GrammarConstraint",
    "Grammar",
    "make_grammar",
    "GrammarLogitsProcessor",
    "generate_json",
    "StructuredResult",
]
