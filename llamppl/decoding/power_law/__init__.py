"""The power-law token sampler (``llamppl.decoding.power_law``).

- :mod:`~llamppl.decoding.power_law.sampler` — :class:`PowerLawSampler`: the reshaping of a
  batch of logits toward an adaptive target probability, as a sampler and a HF
  ``LogitsProcessor``;
- :mod:`~llamppl.decoding.power_law.proposal` — :class:`PowerLawProposal`: the sampler as an
  SMC proposal with its exact density.

::

    from llamppl.decoding.power_law import PowerLawSampler
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from llamppl import lazy_exports
from llamppl.decoding.power_law.proposal import PowerLawProposal, power_law_history

if _TYPE_CHECKING:  # for type checkers and the docs; at run time: __getattr__ below
    from llamppl.decoding.power_law.sampler import PRESETS, PowerLawDraw, PowerLawSampler

__all__ = ["PRESETS", "PowerLawDraw", "PowerLawProposal", "PowerLawSampler", "power_law_history"]

# The sampler is a transformers LogitsProcessor: imported when first looked up
__getattr__, __dir__ = lazy_exports.lazy_exports(
    globals(),
    {
        "PowerLawSampler": "llamppl.decoding.power_law.sampler:PowerLawSampler",
        "PowerLawDraw": "llamppl.decoding.power_law.sampler:PowerLawDraw",
        "PRESETS": "llamppl.decoding.power_law.sampler:PRESETS",
    },
)
