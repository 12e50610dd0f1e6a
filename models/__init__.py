"""Library programs of llamppl (``llamppl.models``): ready-made ``Model`` subclasses."""

from .constraints import Constraint, banned_words, max_word_length, regex_prefix
from .hard_constraints import HardConstraint
from .infilling import Infilling
from .mh_power import mh_power_sampling
from .power_law import PRESETS as POWER_LAW_PRESETS
from .power_law import PowerLawDraw, PowerLawSampler
from .power_law_proposal import PowerLawProposal, power_law_history
from .power_sampling import PowerSampling, low_temperature_decode, power_smc
from .prompt_intersection import PromptIntersection
from .specs import beam_search, specs
from .speculative import SpeculativeDecoding, SpeculativeResult, speculative_smc, truncated_draft

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
]
from .grammar import GrammarConstraint, make_grammar  # noqa: E402
from .grammar_engine import Grammar  # noqa: E402

__all__ += ["GrammarConstraint", "Grammar", "make_grammar"]
from .grammar_logits import GrammarLogitsProcessor  # noqa: E402
from .structured import StructuredResult, generate_json  # noqa: E402

__all__ += ["GrammarLogitsProcessor", "generate_json", "StructuredResult"]
