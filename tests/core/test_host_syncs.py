"""Host syncs per SMC step do not grow with the number of particles.

A ``TorchFunctionMode`` counts every tensor method that reads a value back to the
host (``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``int()``, ``float()``,
``bool()``) while SMC runs a fixed-length program; the count per step must be the
same at N = 2, 8 and 32. Before batched sampling it grew like N (one read of the
sampled id and one of its log-prob per particle).
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from torch.overrides import TorchFunctionMode

from inference import smc_standard
from llamppl import LMContext, Model
from tests.inference.programs import toy_lm

_READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__bool__,
    torch.Tensor.__index__,
}


class SyncCounter(TorchFunctionMode):
    """Counts the host reads of tensor values made inside the ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


class MaskedTokens(Model):
    """T steps: observe "next token is not EOS" (a mask), sample the token, observe one more."""

    def __init__(self, lm, steps: int, eos: int, observed: int) -> None:
        super().__init__()
        self.context = LMContext(lm, [0])
        self.steps, self.eos, self.observed = steps, eos, observed

    async def step(self) -> None:
        allowed = [i for i in range(self.context.lm.vocab_size) if i != self.eos]
        await self.observe(self.context.mask_dist(allowed), True)
        await self.sample(self.context.next_token())
        if len(self.context.generated) == self.steps - 1:
            await self.observe(self.context.next_token(), self.observed)
        if len(self.context.generated) >= self.steps:
            self.finish()


def syncs_per_step(lm, n: int, steps: int, eos: int, observed: int) -> float:
    model = MaskedTokens(lm, steps, eos, observed)
    with SyncCounter() as counter:
        asyncio.run(smc_standard(model, n, ess_threshold=0.5, seed=0))
    return counter.count / steps


def test_counter_sees_reads() -> None:
    with SyncCounter() as counter:
        x = torch.arange(3.0)
        float(x[0]), int(x[1]), x.tolist()
    assert counter.count == 3


def test_function_lm_syncs_per_step_do_not_grow_with_n() -> None:
    counts = {n: syncs_per_step(toy_lm(), n, steps=4, eos=3, observed=1) for n in (2, 8, 32)}
    assert counts[2] == counts[8] == counts[32], counts


@pytest.mark.slow
def test_embedded_model_syncs_per_step_do_not_grow_with_n(make_lm) -> None:
    eos = min(make_lm().eos_token_ids)
    counts = {n: syncs_per_step(make_lm(), n, steps=3, eos=eos, observed=11) for n in (2, 8, 32)}
    assert counts[2] == counts[8] == counts[32], counts
