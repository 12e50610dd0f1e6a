"""The power-law token sampler (``llamppl.decoding.power_law``).

- :mod:`~llamppl.decoding.power_law.sampler` — :class:`PowerLawSampler`: the reshaping of a
  batch of logits toward an adaptive target probability, as a sampler and a HF
  ``LogitsProcessor``;
- :mod:`~llamppl.decoding.power_law.proposal` — :class:`PowerLawProposal`: the sampler as an
  SMC proposal with its exact density.

::

    from llamppl.decoding.power_law import PowerLawSampler
"""

from llamppl.decoding.power_law.proposal import PowerLawProposal, power_law_history
from llamppl.decoding.power_law.sampler import PRESETS, PowerLawDraw, PowerLawSampler

__all__ = ["PRESETS", "PowerLawDraw", "PowerLawProposal", "PowerLawSampler", "power_law_history"]
