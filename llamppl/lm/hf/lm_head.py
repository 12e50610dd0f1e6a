"""The LM head of :class:`~llamppl.CachedCausalLM`: final hidden states to normalised log-probs.

The head's product, the config's logit transforms (:class:`~llamppl.lm.hf.arch.Architecture`)
and a float32 log-softmax, row by row. In the batch-invariant layout the head's matrix
product gets the row counts its kernel treats alike, as the decoder's do
(:class:`~llamppl.lm.hf.batch_plan.PaddedCalls` / :class:`~llamppl.lm.hf.batch_plan.FixedCalls`),
so a context's log-probs do not depend on how many others are read out with it::

    logps = head_logprobs(head, arch, hidden, device, rows=PaddedCalls())   # (n, V) float32
"""

from __future__ import annotations

import torch

from .arch import Architecture
from .batch_plan import RowCalls

__all__ = ["head_logprobs"]


def head_logprobs(
    head: torch.nn.Module,
    arch: Architecture,
    hidden: torch.Tensor,
    device: torch.device,
    rows: RowCalls | None = None,
) -> torch.Tensor:
    """Normalised float32 log-probs ``(n, V)`` on ``device`` from final hidden states ``(n, D)``;
    with ``rows``, the head runs on ``rows``' calls, each padded with zero rows."""
    if rows is None:
        return _logprobs(head, arch, hidden, device)
    out = []
    for a, b in rows.calls(hidden.shape[0]):
        h = hidden[a:b]  # (k, D)
        pad = rows.rows(b - a) - (b - a)
        if pad:
            h = torch.cat([h, h.new_zeros(pad, h.shape[1])])
        out.append(_logprobs(head, arch, h, device)[: b - a])
    return out[0] if len(out) == 1 else torch.cat(out)


def _logprobs(
    head: torch.nn.Module, arch: Architecture, hidden: torch.Tensor, device: torch.device
) -> torch.Tensor:
    logits = head(hidden.to(head.weight.device)).float()  # (n, V)
    return torch.log_softmax(arch.transform_logits(logits), dim=-1).to(device)
