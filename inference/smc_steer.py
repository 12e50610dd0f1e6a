"""``smc_steer``: SMC steering, Algorithm 1 of the LLaMPPL paper.

Every step, each live particle is extended ``n_beam`` = K times (each child
carrying weight w/K, finished particles carried once with weight w), identical
candidates are merged (weights summed), and the N' candidates are down-sampled
to N without replacement (Fearnhead & Clifford 2003) by :func:`steer_downsample`.

Unbiasedness. Write ŵ_j for the candidates' weights and S = Σ_j ŵ_j, so that
Ẑ = S / N. Choose c with Σ_j min(1, c ŵ_j) = N. Candidates with c ŵ_j >= 1 are
kept with their weight; each other candidate is kept with probability c ŵ_j
(one stratified pass, so exactly N − |I_det| are kept and none twice) and given
weight 1/c. Then E[new weight of j] = c ŵ_j · 1/c = ŵ_j for every j, so the new
weights still sum to S in expectation and Ẑ = (1/N) Σ_i w_i stays unbiased. (In
the paper's normalised notation the kept stochastic weight is W_tot / c.)

    result = await smc_steer(model, n_particles=8, n_beam=3, seed=0)
"""

from __future__ import annotations

import math

import numpy as np

from llamppl.modeling import Model
from llamppl.rng import make_rng, using_rng
from llamppl.validation import check_positive_int
from llamppl.weights import ess, logsumexp

from .particles import LMCounters, Progress, begin_all, check_model, log_weights, step_all
from .result import SMCResult, StepRecord

__all__ = ["smc_steer", "steer_downsample", "merge_duplicates"]


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


def merge_duplicates(particles: list[Model]) -> list[Model]:
    """Merge particles with equal ``state_key()`` into one whose weight is their summed weight."""
    merged: dict[object, Model] = {}
    for p in particles:
        key = (p.state_key(), p.finished)
        q = merged.get(key)
        if q is None:
            merged[key] = p
        else:
            q.weight = logsumexp(np.array([q.weight, p.weight]))
    return list(merged.values())


async def smc_steer(
    model: Model,
    n_particles: int,
    n_beam: int,
    seed: int | np.random.Generator | None = None,
    progress: bool | None = None,
) -> SMCResult:
    """SMC steering (LLaMPPL Algorithm 1): K = ``n_beam`` extensions per particle, down-sampled to N.

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
            particles = merge_duplicates(particles)
            t = 0
            while not all(p.done_stepping() for p in particles):
                candidates, extended = [], []
                for p in particles:
                    if p.done_stepping():
                        candidates.append(p)
                        continue
                    children = [p] + [p.clone() for _ in range(k - 1)]
                    for c in children:
                        c.weight -= math.log(k)
                    candidates += children
                    extended += children
                await step_all(extended)
                candidates = merge_duplicates(candidates)
                w = log_weights(candidates)
                t += 1
                keep, new_w = steer_downsample(w, n, rng)
                particles = [candidates[i] for i in keep.tolist()]
                for p, lw in zip(particles, new_w.tolist()):
                    p.weight = lw
                resampled = len(candidates) > len(keep)
                log_ml = logsumexp(w) - math.log(n)
                live = sum(not p.done_stepping() for p in particles)
                history.append(
                    StepRecord(t, ess(w), resampled, keep if resampled else None, log_ml, live)
                )
                bar.update(candidates=len(candidates), live=live)
    finally:
        bar.close()
    w = log_weights(particles)
    stats = counters.finish(steps=len(history), n_particles=n, n_beam=k)
    return SMCResult(particles, w, logsumexp(w) - math.log(n), history, stats, "smc_steer")
