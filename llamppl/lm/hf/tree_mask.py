"""Attention masks of one batched cached forward: row layout -> per-layer tree and window masks.

Given a :class:`~llamppl.lm.hf.batch_plan.RowPlan` on the device, :func:`tree_mask`
builds the boolean ``(B, T, P + T)`` mask (True = attend): a query sees its
row's real cached keys (not the left padding), and among the new tokens its
ancestors and itself (the causal triangle for a chain, the group's
ancestor-or-self matrix for a tree). :func:`layer_masks` turns it into what
each decoder layer takes: a windowed layer (sliding-window attention) also
needs ``pos(q) - pos(k) < window`` (transformers' sliding-window overlay);
eager attention takes an additive float mask, ``sdpa`` the boolean one; models
with mixed layers take a ``{layer type: mask}`` dict::

    mask = tree_mask(T, P, t_t, p_t, plan.trees, anc_t)        # (B, T, P+T) bool
    attention_mask = layer_masks(mask, pos_t, p_t, P, arch, additive=False, dtype=dtype)
"""

from __future__ import annotations

import torch

from .arch import Architecture

__all__ = ["layer_masks", "tree_mask"]


def tree_mask(
    T: int,
    P: int,
    t_t: torch.Tensor,
    p_t: torch.Tensor,
    trees: list[tuple[int, int]],
    anc_t: torch.Tensor,
) -> torch.Tensor:
    """The tree mask ``(B, T, P + T)``.

    ``t_t``, ``p_t`` ``(B,)``: new tokens and cached keys per row (both left padded);
    ``trees``: ``(row, size)`` of branching groups, whose ancestor-or-self matrices
    ``anc_t`` holds flattened, in order.
    """
    B = t_t.shape[0]
    dev = t_t.device
    ar_t = torch.arange(T, device=dev)
    prefix_ok = torch.arange(P, device=dev)[None, :] >= (P - p_t)[:, None]  # (B, P)
    qi, kj = ar_t[:, None], ar_t[None, :]  # (T, 1), (1, T)
    new_ok = (kj <= qi)[None] & (
        (kj[None] >= (T - t_t)[:, None, None]) | (kj == qi)[None]
    )  # (B, T, T)
    at = 0
    for b, t in trees:
        new_ok[b, T - t :, T - t :] = anc_t[at : at + t * t].view(t, t).bool()
        at += t * t
    return torch.cat([prefix_ok[:, None, :].expand(B, T, P), new_ok], dim=2)  # (B, T, P+T)


def layer_masks(
    mask: torch.Tensor,
    pos_t: torch.Tensor,
    p_t: torch.Tensor,
    P: int,
    arch: Architecture,
    additive: bool,
    dtype: torch.dtype,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The tree mask ``(B, T, P+T)`` as each layer needs it, ``(B, 1, T, P+T)``.

    A windowed layer sees key k from query q iff ``pos(q) - pos(k) < window``, on
    top of the tree mask (``pos_t`` ``(B, T)``: the new tokens' positions; cached
    key j of row b sits at position ``j - (P - p_t[b])``). ``additive``: a float
    mask of ``dtype`` (0 = attend, the dtype's minimum = not), for eager attention.
    """
    dev = mask.device
    dist = None
    if any(w is not None for w in arch.windows):
        key_pos = torch.cat(
            [torch.arange(P, device=dev)[None, :] - (P - p_t)[:, None], pos_t], dim=1
        )  # (B, P+T); padding columns are masked anyway
        dist = pos_t[:, :, None] - key_pos[:, None, :]  # (B, T, P+T)
    by_window: dict[int | None, torch.Tensor] = {}
    for w in set(arch.windows):
        m = mask if w is None else mask & (dist < w)
        m = m[:, None]  # (B, 1, T, P+T)
        if additive:
            m = torch.zeros(m.shape, dtype=dtype, device=dev).masked_fill_(
                ~m, torch.finfo(dtype).min
            )
        by_window[w] = m
    if arch.mask_is_dict:
        return {t: by_window[w] for t, w in zip(arch.layer_types or (), arch.windows, strict=True)}
    return by_window[arch.windows[0]]
