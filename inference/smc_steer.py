"""``smc_steer``: SMC steering, Algorithm 1 of the LLaMPPL paper.

Each step has three parts.

1. **Extend.** The N population slots are shared out among the live
   particles, and a particle holding s slots is extended s·K times
   (K = ``n_beam``). Each child carries weight W/(s·K). A finished particle
   is carried over once with its weight W. While N particles are live this
   is N·K proposals, exactly as in Algorithm 1 (lines 8–15).
2. **Merge.** Candidates with equal ``state_key()`` are combined into one
   candidate. Its weight is the sum of their weights, and its multiplicity
   is the number of children it stands for.
3. **Down-sample.** :func:`steer_downsample` reduces the candidates to at
   most N without replacement (Fearnhead & Clifford 2003), with weights
   unbiased per candidate (lines 18–30). When N or more distinct candidates
   exist, each survivor holds one slot at the next step. When fewer exist,
   all are kept and the N slots are split among the live ones in proportion
   to their multiplicities (see :func:`allocate_slots`).

Why merging keeps the algorithm exact. Write the population as weighted
states {(x_j, W_j)} with Ẑ = Σ_j W_j / N. Every estimate the algorithm makes,
E[Σ_j W_j f(x_j)] = Z·E_π[f] with Ẑ unbiased, depends on the population only
through the weighted empirical measure Σ_j W_j δ_{x_j}. Two particles in the
same state x with weights W_1 and W_2 give the same measure as one particle
(x, W_1 + W_2). Merging therefore changes no expectation. It is also
essential, not just an optimisation: the down-sampler keeps each candidate
at most once, so N distinct states come back whenever N distinct
extensions exist.

Merging must not reduce the sampling effort. The earlier version merged
and then extended a merged particle only K times. At the first step all N
clones are one state, so that version drew only K first tokens in total.
Here the extension budget is slots, not particles. The N slots always go to
the live particles, so every step draws N·K proposals (fewer only once
particles finish). A particle's weight is split evenly over its s·K
children, so E[Σ children weights · G_t] = W·E[G_t | x]. Extension is
therefore unbiased for any allocation that depends only on the past. The
allocation follows multiplicities, so that a state reached by m children
gets about m times the proposals: the share it would have had without
merging.

Why down-sampling is unbiased. Write ŵ_j for the candidates' weights and
S = Σ_j ŵ_j, so Ẑ = S/N. Choose c with Σ_j min(1, c ŵ_j) = N. A candidate
with c ŵ_j ≥ 1 is kept with its own weight. Every other candidate is kept
with probability c ŵ_j and then given weight 1/c. The draw is one
stratified pass, so exactly N − |I_det| are kept and none twice. Then
E[new weight of j] = c ŵ_j · 1/c = ŵ_j for every j, and Ẑ stays unbiased.
(In the paper's normalised notation the kept stochastic weight is W_tot/c,
line 30.)

    result = await smc_steer(model, n_particles=8, n_beam=3, seed=0)
"""

from __future__ import annotations

import math

import numpy as np

from llamppl.modeling import Model
from llamppl.rng import make_rng, using_rng
from llamppl.validation import check_positive_int
from llamppl.weights import ess, logsumexp

from .particles import (
    LMCounters,
    Progress,
    begin_all,
    check_model,
    log_weights,
    merge_identical,
    step_all,
)
from .result import SMCResult, StepRecord

__all__ = ["smc_steer", "steer_downsample", "allocate_slots", "merge_duplicates"]


def steer_downsample(
    log_weights: np.ndarray, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Keep at most ``n`` distinct candidates with weights that are unbiased for each candidate's weight.

    Returns ``(indices, new_log_weights)``. Zero-weight candidates are dropped;
    if at most ``n`` remain they are all kept unchanged.
    """
    log_w = np.asarray(log_weights, dtype=np.float64)
    alive = np.flatnonzero(log_w > -np.inf)
    if alive.size <= n:
        return alive, log_w[alive]
    total = logsumexp(log_w[alive])
    w = np.exp(log_w[alive] - total)  # normalised, sums to 1
    order = np.argsort(-w, kind="stable")
    ws = w[order]
    tail = np.cumsum(ws[::-1])[::-1]  # tail[k] = Σ_{j>=k} ws[j]
    for k in range(n):  # k = number kept deterministically (always breaks by k = n - 1)
        c = (n - k) / tail[k]
        if c * ws[k] < 1.0:
            break
    det, sto = order[:k], order[k:]
    p = np.minimum(c * ws[k:], 1.0)  # inclusion probabilities, Σ p = n - k
    points = rng.random() + np.arange(n - k)
    cdf = np.cumsum(p)
    cdf[-1] = max(cdf[-1], n - k)  # round-off guard: the last point must land inside
    picked = sto[np.searchsorted(cdf, points, side="right")]
    indices = np.concatenate([alive[det], alive[picked]])
    new_w = np.concatenate([log_w[alive[det]], np.full(picked.size, total - math.log(c))])
    return indices, new_w


def allocate_slots(multiplicities: np.ndarray, n_slots: int) -> np.ndarray:
    """Share ``n_slots`` extension slots among particles: one each, the rest in proportion to multiplicity.

    Largest-remainder rounding, ties to the lower index, so the allocation is a
    deterministic function of the multiplicities (any such rule keeps Ẑ unbiased;
    see the module docstring).
    """
    m = np.asarray(multiplicities, dtype=np.float64)
    if m.size == 0:
        return np.zeros(0, dtype=np.int64)
    if n_slots < m.size:
        raise ValueError(
            f"n_slots must be at least the number of particles ({m.size}), got {n_slots}"
        )
    extra = n_slots - m.size
    share = extra * m / m.sum()
    slots = np.floor(share).astype(np.int64)
    remainder = share - slots
    slots[np.argsort(-remainder, kind="stable")[: extra - int(slots.sum())]] += 1
    return slots + 1


def merge_duplicates(particles: list[Model]) -> list[Model]:
    """Merge particles with equal state into one carrying their summed weight."""
    return merge_identical(particles)[0]


def _extend(particles: list[Model], slots: np.ndarray, k: int) -> tuple[list[Model], list[Model]]:
    """Line 8–15 of Algorithm 1: s·K children per live particle holding s slots, weight W/(s·K) each.

    Returns ``(candidates, children)``: the candidates include finished particles, carried once.
    """
    candidates: list[Model] = []
    children: list[Model] = []
    for p, s in zip(particles, slots.tolist()):
        if p.done_stepping():
            candidates.append(p)
            continue
        m = s * k
        family = [p] + [p.clone() for _ in range(m - 1)]
        for c in family:
            c.weight -= math.log(m)
        candidates += family
        children += family
    return candidates, children


def _slots_for(particles: list[Model], multiplicities: np.ndarray, n: int) -> np.ndarray:
    """The N population slots: one per finished particle, the rest shared among live ones."""
    live = np.array([not p.done_stepping() for p in particles], dtype=bool)
    slots = np.zeros(len(particles), dtype=np.int64)
    if live.any():
        slots[live] = allocate_slots(multiplicities[live], n - int((~live).sum()))
    return slots


async def smc_steer(
    model: Model,
    n_particles: int,
    n_beam: int,
    seed: int | np.random.Generator | None = None,
    progress: bool | None = None,
) -> SMCResult:
    """SMC steering (LLaMPPL Algorithm 1): N·K extensions per step, down-sampled to N distinct particles.

    Returns an ``SMCResult`` with ``log_ml = log (1/N) Σ_i w_i``, whose exponential Ẑ is an
    unbiased estimate of Z. The result holds N distinct particles whenever at least N distinct
    extensions with positive weight exist.
    """
    check_model(model)
    n = check_positive_int("n_particles", n_particles)
    k = check_positive_int("n_beam", n_beam)
    rng = make_rng(seed)
    counters = LMCounters(model)
    bar = Progress(progress, "smc_steer")
    history: list[StepRecord] = []
    try:
        with using_rng(rng):
            particles = [model.clone() for _ in range(n)]
            await begin_all(particles)
            particles, mult = merge_identical(particles)
            t = 0
            while not all(p.done_stepping() for p in particles):
                slots = _slots_for(particles, mult, n)
                candidates, children = _extend(particles, slots, k)
                await step_all(children)
                candidates, mult = merge_identical(candidates)
                w = log_weights(candidates)
                t += 1
                keep, new_w = steer_downsample(w, n, rng)
                particles, mult = [candidates[i] for i in keep.tolist()], mult[keep]
                for p, lw in zip(particles, new_w.tolist()):
                    p.weight = lw
                resampled = len(candidates) > len(keep)
                log_ml = logsumexp(w) - math.log(n)
                live = sum(not p.done_stepping() for p in particles)
                history.append(
                    StepRecord(t, ess(w), resampled, keep if resampled else None, log_ml, live)
                )
                bar.update(proposals=len(children), candidates=len(candidates), live=live)
    finally:
        bar.close()
    w = log_weights(particles)
    stats = counters.finish(steps=len(history), n_particles=n, n_beam=k)
    return SMCResult(particles, w, logsumexp(w) - math.log(n), history, stats, "smc_steer")
