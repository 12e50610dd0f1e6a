"""The conservative power-law preset stays conservative when the model offers no likely token."""

from __future__ import annotations

import torch

from llamppl.models import PowerLawSampler


def test_conservative_target_never_climbs_above_its_base():
    sampler = PowerLawSampler.preset("conservative")
    low_history = torch.full((4,), 0.1)  # recent picks far below 0.6: PL-2 would raise the target
    assert float(sampler.next_target(low_history)) <= sampler.target + 1e-6  # float32 of 0.6
