"""Library programs of llamppl (``llamppl.models``): ready-made ``Model`` subclasses and the
drivers of the seed papers (``power_smc``, ``speculative_smc``, ``specs``, ``generate_json``,
``text_to_sql``).

Constraints, which programs take, are imported from :mod:`llamppl.constraints`; the
token-level kernels live one floor down in :mod:`llamppl.decoding`. The power-law sampler and
the grammar logits processor are re-exported here. Old spellings (``llamppl.models``'s
constraint names, ``llamppl.models.constraints``, ``.power_law``, ...) are rows of the
compatibility table (:mod:`llamppl.compat`).
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from llamppl import lazy_exports
from llamppl.decoding.power_law.proposal import PowerLawProposal, power_law_history

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
from .sql import SQLAnswer, SQLResult, TextToSQL, text_to_sql, text_to_sql_async
from .sql_prompt import SQLExample
from .structured import StructuredResult, generate_json, generate_json_async

if _TYPE_CHECKING:  # for type checkers and the docs; at run time: __getattr__ below
    from llamppl.decoding.grammar.logits import GrammarLogitsProcessor
    from llamppl.decoding.power_law.sampler import PRESETS as POWER_LAW_PRESETS
    from llamppl.decoding.power_law.sampler import PowerLawDraw, PowerLawSampler

__all__ = [
    "specs",
    "beam_search",
    "PowerLawSampler",
    "PowerLawProposal",
    "PowerLawDraw",
    "POWER_LAW_PRESETS",
    "power_law_history",
    "HardConstraint",
    "Infilling",
    "PromptIntersection",
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
    "GrammarLogitsProcessor",
    "generate_json",
    "generate_json_async",
    "StructuredResult",
    "TextToSQL",
    "text_to_sql",
    "text_to_sql_async",
    "SQLAnswer",
    "SQLResult",
    "SQLExample",
]

# transformers LogitsProcessors (the power-law sampler, the grammar's HF masking): imported
# when first looked up, so that the programs do not load transformers (llamppl.lazy_exports)
__getattr__, __dir__ = lazy_exports.lazy_exports(
    globals(),
    {
        "PowerLawSampler": "llamppl.decoding.power_law.sampler:PowerLawSampler",
        "PowerLawDraw": "llamppl.decoding.power_law.sampler:PowerLawDraw",
        "POWER_LAW_PRESETS": "llamppl.decoding.power_law.sampler:PRESETS",
        "GrammarLogitsProcessor": "llamppl.decoding.grammar.logits:GrammarLogitsProcessor",
    },
)
