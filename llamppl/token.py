"""``Token``: a sampled vocabulary item, and exact inverse-CDF sampling from log-probs.

A ``Token`` compares equal to its integer id and to any other ``Token`` with the
same id; ``str(token)`` is its text::

    tok = Token(lm, 42)
    tok == 42, int(tok), str(tok)

The per-particle reads of one SMC step (a sampled id and its log-prob, an observed
token's log-prob, a mask's two log-masses) are awaited with :func:`sample_row`,
:func:`gather_row` and :func:`row_masses`: the requests awaited concurrently on one
event loop are served together (:class:`~llamppl.batching.Coalescer`), with one
batched tensor computation and ONE host read per round, whatever the number of
particles::

    (i, lp_i), lp_j = await asyncio.gather(sample_row(lp, rng), gather_row(lp, j))
"""

from __future__ import annotations

import asyncio
import weakref

import numpy as np
import torch

from .batching import Coalescer

__all__ = ["Token", "sample_index", "sample_row", "gather_row", "row_masses"]


class Token:
    """A token id together with the language model that gives it meaning."""

    __slots__ = ("lm", "token_id")

    def __init__(self, lm, token_id: int) -> None:
        self.lm = lm
        self.token_id = int(token_id)

    @property
    def token_str(self) -> str:
        return self.lm.vocab[self.token_id]

    def __str__(self) -> str:
        return self.token_str

    def __repr__(self) -> str:
        return f"<Token {self.token_id} {self.token_str!r}>"

    def __int__(self) -> int:
        return self.token_id

    __index__ = __int__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Token):
            return self.token_id == other.token_id
        if isinstance(other, (int, np.integer)) and not isinstance(other, bool):
            return self.token_id == int(other)
        if isinstance(other, str):  # LLaMPPL: a token equals its text
            return self.token_str == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.token_id)

    def __deepcopy__(self, memo) -> Token:
        return self  # immutable; shares the LM


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


async def sample_row(log_probs: torch.Tensor, rng: np.random.Generator) -> tuple[int, float]:
    """Draw ``i`` with probability ``exp(log_probs[i]) / Σ exp(log_probs)``; return ``(i, log_probs[i])``.

    Batched with the other rows awaited in the same event-loop round. The uniform
    is ``rng.random()``, drawn in submission order, so a run is reproducible from
    its seed and each draw is the same as :func:`sample_index`'s with that uniform.
    """
    return await _coalescer().submit(("sample", log_probs, rng))


async def gather_row(log_probs: torch.Tensor, index: int) -> float:
    """``float(log_probs[index])``, read together with the other rows of the round."""
    return await _coalescer().submit(("gather", log_probs, int(index)))


async def row_masses(log_probs: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """``(logsumexp(log_probs[mask]), logsumexp(log_probs[~mask]))``, batched with the round."""
    return await _coalescer().submit(("masses", log_probs, mask))


def serve_rows(requests: list[tuple]) -> list:
    """Serve a round of row requests: one tensor computation and one host read per row shape.

    Sampling is inverse CDF on the stacked rows ``L [n, V]``: with ``p = exp(L - max L)``
    and cumulative sums ``c``, row ``b`` takes ``i_b = #{j : c_bj <= u_b c_bV}``, i.e.
    ``P(i_b = v) = p_bv / Σ_j p_bj`` (a zero-probability entry is never returned).
    """
    groups: dict[tuple, list[int]] = {}
    for k, (_, row, _) in enumerate(requests):
        groups.setdefault((tuple(row.shape), row.dtype, row.device), []).append(k)
    out: list = [None] * len(requests)
    for positions in groups.values():
        _serve_group(requests, positions, out)
    return out


def _serve_group(requests: list[tuple], positions: list[int], out: list) -> None:
    by_op: dict[str, list[int]] = {"sample": [], "gather": [], "masses": []}
    for k in positions:
        by_op[requests[k][0]].append(k)
    parts: list[torch.Tensor] = []
    if by_op["sample"]:
        ks = by_op["sample"]
        rows = torch.stack([requests[k][1] for k in ks])  # [n, V]
        u = np.array([requests[k][2].random() for k in ks])  # submission order
        ids = _draw(rows, torch.from_numpy(u).to(device=rows.device, dtype=rows.dtype))
        parts += [ids.double(), rows.gather(1, ids[:, None])[:, 0].double()]
    if by_op["gather"]:
        parts.append(
            torch.stack([requests[k][1][requests[k][2]] for k in by_op["gather"]]).double()
        )
    if by_op["masses"]:
        ks = by_op["masses"]
        rows = torch.stack([requests[k][1] for k in ks])  # [n, V]
        masks = torch.stack([requests[k][2] for k in ks])  # [n, V] bool
        inside, outside = _log_masses(rows, masks)
        parts += [inside.double(), outside.double()]
    values = torch.cat(parts).tolist()  # the round's one host read
    at = 0
    if by_op["sample"]:
        n = len(by_op["sample"])
        for j, k in enumerate(by_op["sample"]):
            out[k] = (int(values[at + j]), values[at + n + j])
        at += 2 * n
    for j, k in enumerate(by_op["gather"]):
        out[k] = values[at + j]
    at += len(by_op["gather"])
    n = len(by_op["masses"])
    for j, k in enumerate(by_op["masses"]):
        out[k] = (values[at + j], values[at + n + j])


def _draw(rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF index per row of log-probs ``rows [n, V]`` from uniforms ``u [n]``; stays on device."""
    probs = torch.exp(rows - rows.amax(dim=1, keepdim=True))  # [n, V], max entry 1
    cdf = torch.cumsum(probs, dim=1)  # [n, V]
    ids = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]  # [n]
    ids = ids.clamp_(max=rows.shape[1] - 1)
    # u·total rounded onto the float boundary at the top lands on a zero entry: take the
    # first id where the CDF reaches its total instead (a positive entry: the CDF rose there)
    top = torch.searchsorted(cdf, cdf[:, -1:].contiguous(), right=False)[:, 0]  # [n]
    return torch.where(probs.gather(1, ids[:, None])[:, 0] > 0, ids, top)


def _log_masses(rows: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, ``log Σ_{v∈S} e^{x_v}`` inside and outside ``masks`` (``[n, V]``), with one ``exp``.

    ``log Σ_{v∈S} e^{x_v} = m + log Σ_{v∈S} e^{x_v - m}`` with ``m`` the row's maximum,
    in float64 so a side whose mass is above ``e^{-700}`` of the row's largest entry
    does not underflow (``logsumexp`` of a ``masked_fill``-ed row is several times
    slower on CPU: ``exp`` and ``log`` of ``-inf`` take a slow path).
    """
    m = rows.amax(dim=1, keepdim=True)  # [n, 1]
    m = torch.where(torch.isfinite(m), m, 0.0)
    e = torch.exp((rows - m).double())  # [n, V], largest entry 1
    m = m[:, 0].double()
    return torch.log((e * masks).sum(dim=1)) + m, torch.log((e * ~masks).sum(dim=1)) + m
