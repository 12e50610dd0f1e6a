"""Exact draws and reads from rows of log-probabilities, batched across particles.

:func:`sample_index` draws one index by inverse CDF. The per-particle reads of one
SMC step (a sampled id and its log-prob, an observed token's log-prob, a mask's two
log-masses) are awaited with :func:`sample_row`, :func:`gather_row` and
:func:`row_masses`: the requests awaited concurrently on one event loop are served
together (:class:`~llamppl.batching.Coalescer`), with one batched tensor computation
and ONE host read per round, whatever the number of particles::

    i = sample_index(log_probs, rng)                                     # (V,) -> int
    (i, lp_i), lp_j = await asyncio.gather(sample_row(lp, rng), gather_row(lp, j))
"""

from __future__ import annotations

import asyncio
import math
import weakref

import numpy as np
import torch

from .batching import Coalescer

__all__ = ["sample_index", "sample_row", "gather_row", "row_masses", "serve_rows"]


def sample_index(log_probs: torch.Tensor, rng: np.random.Generator) -> int:
    """Draw an index with probability ``exp(log_probs)`` (normalised or not) by inverse CDF.

    One uniform comes from ``rng``; the cumulative sum stays on the tensor's
    device. Zero-probability entries are never chosen.
    """
    probs = torch.exp(log_probs - log_probs.max())  # (V,)
    cdf = torch.cumsum(probs, dim=0)
    u = float(rng.random()) * float(cdf[-1])
    idx = int(
        torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype, device=cdf.device), right=True)
    )
    idx = min(idx, probs.numel() - 1)
    if (
        probs[idx] <= 0
    ):  # u landed on the float boundary at the very top: take the last possible entry
        idx = int(torch.nonzero(probs > 0)[-1])
    return idx


# ---------------------------------------------------------------- batched row reads
# A request is (op, row, arg): ("sample", (V,) log-probs, rng), ("gather", row, index),
# ("masses", row, (V,) bool mask). One Coalescer per event loop (threads run their own).
_COALESCERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _coalescer() -> Coalescer:
    loop = asyncio.get_running_loop()
    c = _COALESCERS.get(loop)
    if c is None:
        c = _COALESCERS[loop] = Coalescer(serve_rows)
    return c


async def sample_row(
    log_probs: torch.Tensor, rng: np.random.Generator, mask: torch.Tensor | None = None
) -> tuple[int, float]:
    """Draw ``i`` with probability ``exp(x_i) / Σ_j exp(x_j)`` (``x = log_probs``); return ``(i, x_i)``.

    With ``mask`` (a bool tensor of the row's shape) the draw is from the row restricted
    to the mask and renormalised, ``P(i) = 1[i∈mask] e^{x_i} / Σ_{j∈mask} e^{x_j}``, and
    the log-prob returned is ``x_i - logsumexp(x[mask])`` (LLaMPPL §2.2, the masked
    proposal M'). The mask must allow an entry of positive probability.

    Batched with the other rows awaited in the same event-loop round. The uniform
    is ``rng.random()``, drawn in submission order, so a run is reproducible from
    its seed and each draw is the same as :func:`sample_index`'s with that uniform
    (on the masked, renormalised row when ``mask`` is given).
    """
    if mask is None:
        return await _coalescer().submit(("sample", log_probs, rng))
    return await _coalescer().submit(("sample_in", log_probs, (rng, _check_mask(log_probs, mask))))


async def gather_row(
    log_probs: torch.Tensor, index: int, mask: torch.Tensor | None = None
) -> float:
    """``float(log_probs[index])``, read together with the other rows of the round.

    With ``mask``: the log-prob of ``index`` in the row restricted to the mask and
    renormalised, ``x_index - logsumexp(x[mask])`` (``-inf`` if the mask excludes it).
    """
    if mask is None:
        return await _coalescer().submit(("gather", log_probs, int(index)))
    return await _coalescer().submit(
        ("gather_in", log_probs, (int(index), _check_mask(log_probs, mask)))
    )


async def row_masses(
    log_probs: torch.Tensor, mask: torch.Tensor, within: torch.Tensor | None = None
) -> tuple[float, float]:
    """``(logsumexp(log_probs[mask]), logsumexp(log_probs[~mask]))``, batched with the round.

    With ``within`` (a pending restriction ``m0``): the masses of the row restricted to
    ``m0`` and renormalised, ``log P(mask | m0)`` and ``log P(~mask | m0)``, i.e.
    ``logsumexp(x[mask & m0]) - logsumexp(x[m0])`` and the same for ``~mask``.
    """
    if within is None:
        return await _coalescer().submit(("masses", log_probs, mask))
    return await _coalescer().submit(
        ("masses_in", log_probs, (mask, _check_mask(log_probs, within, "within")))
    )


def _check_mask(row: torch.Tensor, mask: object, name: str = "mask") -> torch.Tensor:
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor, got {type(mask).__name__}")
    if mask.shape != row.shape:
        raise ValueError(
            f"{name} must have the row's shape {tuple(row.shape)}, got {tuple(mask.shape)}"
        )
    return mask


def serve_rows(requests: list[tuple]) -> list:
    """Serve a round of row requests: one tensor computation and one host read per row shape.

    Sampling is inverse CDF on the stacked rows ``L [n, V]``: with ``p = exp(L - max L)``
    and cumulative sums ``c``, row ``b`` takes ``i_b = #{j : c_bj <= u_b c_bV}``, i.e.
    ``P(i_b = v) = p_bv / Σ_j p_bj`` (a zero-probability entry is never returned).
    A masked draw uses ``p = exp(L - max_{mask} L) · mask`` instead (:func:`_masked_exp`).

    Requests are ``(op, row, arg)``: ``("sample", row, rng)``, ``("sample_in", row, (rng,
    mask))``, ``("gather", row, index)``, ``("gather_in", row, (index, mask))``,
    ``("masses", row, mask)``, ``("masses_in", row, (mask, within))``.
    """
    groups: dict[tuple, list[int]] = {}
    for k, (_, row, _) in enumerate(requests):
        groups.setdefault((tuple(row.shape), row.dtype, row.device), []).append(k)
    out: list = [None] * len(requests)
    for positions in groups.values():
        _serve_group(requests, positions, out)
    return out


_OPS = ("sample", "sample_in", "gather", "gather_in", "masses", "masses_in")


def _serve_group(requests: list[tuple], positions: list[int], out: list) -> None:
    by_op: dict[str, list[int]] = {op: [] for op in _OPS}
    for k in positions:
        by_op[requests[k][0]].append(k)
    # uniforms of the masked and unmasked draws, in submission order
    draws = [k for k in positions if requests[k][0] in ("sample", "sample_in")]
    uniform = dict(zip(draws, _uniforms([_rng_of(requests[k]) for k in draws])))
    parts: list[torch.Tensor] = []  # per op: [n] float64 values, read back together
    widths: list[tuple[str, int]] = []  # (op, values per request) in the order of parts

    def rows_of(ks: list[int]) -> torch.Tensor:
        return torch.stack([requests[k][1] for k in ks])  # [n, V]

    def args_of(ks: list[int], j: int) -> list:
        return [requests[k][2][j] for k in ks]

    if ks := by_op["sample"]:
        rows = rows_of(ks)
        u = _as_row_tensor([uniform[k] for k in ks], rows)
        ids = _invert(torch.exp(rows - rows.amax(dim=1, keepdim=True)), u)
        parts += [ids.double(), rows.gather(1, ids[:, None])[:, 0].double()]
        widths.append(("sample", 2))
    if ks := by_op["sample_in"]:
        rows, masks = rows_of(ks), torch.stack(args_of(ks, 1))
        shift, probs = _masked_exp(rows, masks)
        ids = _invert(probs, _as_row_tensor([uniform[k] for k in ks], rows))
        log_z = shift[:, 0].double() + torch.log(probs.sum(dim=1).double())  # logsumexp(x[mask])
        parts += [ids.double(), rows.gather(1, ids[:, None])[:, 0].double() - log_z]
        widths.append(("sample_in", 2))
    if ks := by_op["gather"]:
        parts.append(torch.stack([requests[k][1][requests[k][2]] for k in ks]).double())
        widths.append(("gather", 1))
    if ks := by_op["gather_in"]:
        rows, masks = rows_of(ks), torch.stack(args_of(ks, 1))
        shift, probs = _masked_exp(rows, masks)
        log_z = shift[:, 0].double() + torch.log(probs.sum(dim=1).double())
        ids = torch.tensor(args_of(ks, 0), device=rows.device)[:, None]
        inside = masks.gather(1, ids)[:, 0]
        lp = rows.gather(1, ids)[:, 0].double() - log_z
        parts.append(torch.where(inside, lp, -math.inf))
        widths.append(("gather_in", 1))
    if ks := by_op["masses"]:
        masks = torch.stack([requests[k][2] for k in ks])  # [n, V] bool
        parts += list(_log_masses(rows_of(ks), masks, ~masks))
        widths.append(("masses", 2))
    if ks := by_op["masses_in"]:
        masks, within = torch.stack(args_of(ks, 0)), torch.stack(args_of(ks, 1))
        parts += list(_log_masses(rows_of(ks), masks & within, ~masks & within))
        widths.append(("masses_in", 2))
    values = torch.cat(parts).tolist()  # the round's one host read
    at = 0
    for op, width in widths:
        ks = by_op[op]
        n = len(ks)
        cols = [values[at + c * n : at + (c + 1) * n] for c in range(width)]
        at += width * n
        for j, k in enumerate(ks):
            out[k] = _result(op, [col[j] for col in cols])


def _result(op: str, v: list[float]):
    if op in ("sample", "sample_in"):
        return int(v[0]), v[1]
    if op == "masses":
        return v[0], v[1]
    if op == "masses_in":  # renormalise within m0: log P(S | m0) = log m(S ∩ m0) - log m(m0)
        total = _logaddexp(v[0], v[1])
        return v[0] - total, v[1] - total
    return v[0]


def _logaddexp(a: float, b: float) -> float:
    hi, lo = max(a, b), min(a, b)
    return hi if lo == -math.inf else hi + math.log1p(math.exp(lo - hi))


def _rng_of(request: tuple):
    return request[2] if request[0] == "sample" else request[2][0]


def _uniforms(rngs: list) -> list[float]:
    return [float(rng.random()) for rng in rngs]  # in the order given


def _as_row_tensor(values: list[float], rows: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, device=rows.device, dtype=rows.dtype)


def _masked_exp(rows: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m, p)`` with ``m [n, 1]`` the largest allowed entry and ``p = exp(L - m) · mask [n, V]``.

    ``Σ_v p_bv = exp(logsumexp(L_b[mask_b]) - m_b)``, at least 1, so the allowed entries
    never underflow together (a shift by the whole row's maximum would lose them when
    the mask's mass is below ``e^{-87}`` in float32). Every ``exp`` argument is finite
    for a finite row (disallowed entries are clamped to 0 before the ``exp`` and then
    multiplied by 0): ``exp`` of ``-inf`` and a bool ``masked_fill`` both take slow
    paths on CPU, a float multiply does not.
    """
    penalty = (~masks).to(rows.dtype).mul_(torch.finfo(rows.dtype).max)  # 0 or the largest float
    m = torch.amax(rows - penalty, dim=1, keepdim=True)  # over the allowed entries only
    probs = torch.exp((rows - m).clamp_(max=0.0)).mul_(masks)
    return m, probs


def _invert(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF index per row of weights ``probs [n, V]`` (max entry > 0) from uniforms ``u [n]``."""
    cdf = torch.cumsum(probs, dim=1)  # [n, V]
    ids = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]  # [n]
    ids = ids.clamp_(max=probs.shape[1] - 1)
    # u·total rounded onto the float boundary at the top lands on a zero entry: take the
    # first id where the CDF reaches its total instead (a positive entry: the CDF rose there)
    top = torch.searchsorted(cdf, cdf[:, -1:].contiguous(), right=False)[:, 0]  # [n]
    return torch.where(probs.gather(1, ids[:, None])[:, 0] > 0, ids, top)


def _log_masses(
    rows: torch.Tensor, inside: torch.Tensor, outside: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, ``log Σ_{v∈S} e^{x_v}`` for the bool sets ``inside`` and ``outside`` (``[n, V]``), one ``exp``.

    ``log Σ_{v∈S} e^{x_v} = m + log Σ_{v∈S} e^{x_v - m}`` with ``m`` the row's maximum,
    in float64 so a side whose mass is above ``e^{-700}`` of the row's largest entry
    does not underflow (``logsumexp`` of a ``masked_fill``-ed row is several times
    slower on CPU: ``exp`` and ``log`` of ``-inf`` take a slow path).
    """
    m = rows.amax(dim=1, keepdim=True)  # [n, 1]
    m = torch.where(torch.isfinite(m), m, 0.0)
    e = torch.exp((rows - m).double())  # [n, V], largest entry 1
    m = m[:, 0].double()
    return torch.log((e * inside).sum(dim=1)) + m, torch.log((e * outside).sum(dim=1)) + m
