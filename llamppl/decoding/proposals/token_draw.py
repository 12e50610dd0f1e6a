"""Batched token draws: one index per row of a ``[B, V]`` weight matrix, by inverse CDF.

The token sampler of :class:`~llamppl.decoding.power_law.sampler.PowerLawSampler` (and of any
kernel that reshapes a batch of next-token distributions and draws from them). Not to
be confused with the resampling schemes of :mod:`llamppl.inference.resampling`, which
draw particle *ancestors* from normalised weights::

    from llamppl.decoding.proposals.token_draw import draw_token_ids, row_uniforms
    ids, totals, chosen = draw_token_ids(weights, row_uniforms(rng, weights.shape[0], weights))
    # ids [B, 1]: P(ids[b] = v) = weights[b, v] / totals[b]; chosen[b] = weights[b, ids[b]]
"""

from __future__ import annotations

import numpy as np
import torch

from llamppl.rng import current_rng

__all__ = ["draw_token_ids", "row_uniforms"]

_CHUNK = 256  # block size of the two-level inverse-CDF sampler


def row_uniforms(
    rng: np.random.Generator | torch.Generator | None, n: int, like: torch.Tensor
) -> torch.Tensor:
    """``[n, 1]`` uniforms in [0, 1) on ``like``'s device and dtype."""
    if isinstance(rng, torch.Generator):
        return torch.rand(n, 1, generator=rng, device=rng.device).to(
            device=like.device, dtype=like.dtype
        )
    if rng is None:
        rng = current_rng()
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng must be a numpy.random.Generator, a torch.Generator or None, got {type(rng).__name__}"
        )
    u = rng.random((n, 1), dtype=np.float32 if like.dtype == torch.float32 else np.float64)
    return torch.from_numpy(u).to(like.device)


def draw_token_ids(
    w: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw one index per row with probability ∝ ``w [B, V]`` (non-negative), from uniforms ``u [B, 1]``.

    Returns (ids, row totals, chosen weights), each ``[B, 1]``. For ``B > 1`` two
    levels (block sums, then one block's cumulative sum) replace the full-row
    cumulative sum, the slowest part of sampling from a 49k vocabulary. A
    zero-weight index is never returned.
    """
    B, V = w.shape
    if B == 1 or V % _CHUNK or V < 4 * _CHUNK:
        cdf = w.cumsum(-1)  # [B, V]
        total = cdf[:, -1:]  # [B, 1]
        ids = torch.searchsorted(cdf, u * total, right=True)  # [B, 1]
    else:
        blocks = w.view(B, V // _CHUNK, _CHUNK)  # [B, nC, C]
        sums = blocks.sum(-1)  # [B, nC]
        cs = sums.cumsum(-1)  # [B, nC]
        total = cs[:, -1:]  # [B, 1]
        r = u * total  # [B, 1]
        k = torch.searchsorted(cs, r, right=True).clamp_(max=V // _CHUNK - 1)  # [B, 1] block
        inner = blocks[torch.arange(B, device=w.device), k[:, 0]]  # [B, C]
        rem = (r - cs.gather(1, k) + sums.gather(1, k)).clamp_(min=0)  # [B, 1] offset in the block
        ids = k * _CHUNK + torch.searchsorted(inner.cumsum(-1), rem, right=True)  # [B, 1]
    ids = ids.clamp_(max=V - 1)
    chosen = w.gather(1, ids)  # [B, 1]
    if not chosen.min().item() > 0:  # u·total rounded past a row's or block's last positive weight
        ar = torch.arange(V, device=w.device)  # [V]
        below = torch.where((w > 0) & (ar <= ids), ar, -1).amax(-1, keepdim=True)  # [B, 1]
        first = torch.where(w > 0, ar, V).amin(-1, keepdim=True)  # [B, 1]
        ids = torch.where(chosen > 0, ids, torch.where(below >= 0, below, first))
        chosen = w.gather(1, ids)
    return ids, total, chosen
