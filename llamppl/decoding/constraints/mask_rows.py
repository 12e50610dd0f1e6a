"""The end rules applied to a batch of token masks (shared by every constraint's ``masked_probs``)."""

from __future__ import annotations

import torch

__all__ = ["finish_rows"]


def finish_rows(
    masks: torch.Tensor, ends: torch.Tensor, end_ids: list[int], final: torch.Tensor
) -> torch.Tensor:
    """Apply the end rules to ``(B, V)`` masks in place: rows with ``final[b]`` keep only the
    end tokens ``end_ids``, whose entries become ``ends[b]`` in every row."""
    cols = torch.as_tensor(end_ids, device=masks.device)
    final = final.to(masks.device)
    if bool(final.any()):
        masks[final] = 0
    masks[:, cols] = ends.to(device=masks.device, dtype=masks.dtype)[:, None]
    return masks
