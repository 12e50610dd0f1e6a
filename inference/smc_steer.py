"""``smc_steer``: SMC steering, Algorithm 1 of the LLaMPPL paper.

The population is N *slots*. Every step each live slot is extended ``n_beam`` = K
times (N·K proposals while N slots are live; finished particles are carried once
with their weight); the candidates are down-sampled to N without replacement
(Fearnhead & Clifford 2003) by :func:`steer_downsample`, and the loop repeats::

    extend → reweight (merge identical candidates) → down-sample → history

Unbiasedness of the down-sampling. Write ŵ_j for the candidates' weights and
S = Σ_j ŵ_j, so that Ẑ = S / N. Choose c with Σ_j min(1, c ŵ_j) = N. Candidates
with c ŵ_j >= 1 are kept with their weight; each other candidate is kept with
probability c ŵ_j (one stratified pass, so exactly N − |I_det| are kept and none
twice) and given weight 1/c. Then E[new weight of j] = c ŵ_j · 1/c = ŵ_j for
every j, so Ẑ = (1/N) Σ_i w_i stays unbiased. (In the paper's normalised
notation the kept stochastic weight is W_tot / c.)

Merging identical candidates, with multiplicity. Candidates with equal
``state_key()`` are merged into one (weights summed) before down-sampling, so the
N survivors are distinct. Merging must not lose proposal effort: a merged
particle carries ``count``, the number of unmerged candidates it stands for, and
fills ``slots`` ∈ [1, count] of the N slots (:func:`allocate_slots`); next step
it gets slots·K children of weight w/(slots·K) each. Why this is Algorithm 1
without merging, statistically:

1. Z stays unbiased. Splitting a weight w over M children, each w/M times its
   own incremental weight, leaves E[Σ children] = w · E[G] for any M fixed before
   the extension; summing weights of equal states changes no state's total.
2. The effort is the same. m unmerged copies of one state, each extended K times,
   draw m·K children i.i.d. from the same proposal (a step depends only on the
   state); the merged particle filling m slots draws exactly those m·K children.
   When the m copies carry equal weights — always at step one, where all N
   clones are one state, and for every stochastically kept candidate (weight
   1/c) — the children's states and weights have exactly the unmerged law. In
   particular the first step makes N·K draws, not K.
3. Slots are never invented: a state gets at most ``count`` slots, as many as
   its unmerged copies could fill; spare slots (fewer than N distinct survivors)
   go to the heaviest states per slot, the states of which Algorithm 1 would most
   likely keep several unmerged copies. With N distinct survivors every slot is
   one particle, as in Algorithm 1.

    result = await smc_steer(model, n_particles=8, n_beam=3, seed=0)
"""

from __future__ import annotations

import math
import os

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
    merge_counted,
    step_all,
)
from .record import recorder_for
from .result import SMCResult, StepRecord

__all__ = ["smc_steer", "steer_downsample", "allocate_slots"]


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


def allocate_slots(
    log_weights: np.ndarray, counts: list[int], live: list[bool], n: int
) -> list[int]:
    """How many of the N slots each kept particle fills next step (it gets slots·K extensions).

    A finished particle fills one slot. Every live particle gets one slot, then the
    remaining ``n − len(kept)`` slots go one at a time to the live particle with the
    largest weight per slot (D'Hondt), never beyond its ``counts`` (the number of
    unmerged candidates it stands for, the most slots Algorithm 1 could give it).
    """
    slots = [1] * len(counts)
    spare = n - len(counts)
    if spare <= 0 or not any(live):
        return slots
    w = np.exp(log_weights - logsumexp(log_weights))
    room = np.array([c - 1 if a else 0 for c, a in zip(counts, live)], dtype=np.int64)
    per_slot = np.where(room > 0, w, -1.0)
    for _ in range(spare):
        i = int(np.argmax(per_slot))
        if per_slot[i] < 0:
            break
        slots[i] += 1
        room[i] -= 1
        per_slot[i] = w[i] / slots[i] if room[i] > 0 else -1.0
    return slots


async def smc_steer(
    model: Model,
    n_particles: int,
    n_beam: int,
    *,
    seed: int | np.random.Generator | None = None,
    progress: bool | None = None,
    json_file: str | os.PathLike | None = None,
    visualization_dir: str | os.PathLike | None = None,
    record: bool | str | os.PathLike = False,
) -> SMCResult:
    """SMC steering (LLaMPPL Algorithm 1): K = ``n_beam`` extensions per slot, down-sampled to N.

    Returns an ``SMCResult`` with ``log_ml = log (1/N) Σ_i w_i``, whose exponential Ẑ is an
    unbiased estimate of Z. The result holds N distinct particles whenever at least N distinct
    extensions with positive weight exist. ``stats["proposals"]`` counts the extensions made
    (N·K per step while N slots are live). ``json_file`` / ``visualization_dir`` write a run
    record (the candidates of every step and the kept ones; :mod:`llamppl.inference.record`);
    ``record=True`` keeps it on ``SMCResult.record`` (``record=path`` also writes it).
    """
    check_model(model)
    n = check_positive_int("n_particles", n_particles)
    k = check_positive_int("n_beam", n_beam)
    rng = make_rng(seed)
    counters = LMCounters(model)
    recorder = recorder_for("smc_steer", n, json_file, visualization_dir, record)
    bar = Progress(progress, "smc_steer")
    history: list[StepRecord] = []
    proposals = 0
    kept: list[int] | None = None  # previous step's kept candidates (for the record's parents)
    try:
        with using_rng(rng):
            particles = [model.clone() for _ in range(n)]
            await begin_all(particles)
            particles, slots = merge_counted(particles, [1] * n)
            while not all(p.done_stepping() for p in particles):
                # extend: a particle filling m slots gets m·K children of weight w/(m·K)
                candidates, counts, extended = [], [], []
                origin: dict[int, int] = {}  # id(candidate) -> index of the particle it extends
                for j, (p, m) in enumerate(zip(particles, slots)):
                    if p.done_stepping():
                        candidates.append(p)
                        counts.append(1)
                        origin[id(p)] = j
                        continue
                    children = [p] + [p.clone() for _ in range(m * k - 1)]
                    for c in children:
                        c.weight -= math.log(m * k)
                        origin[id(c)] = j
                    candidates += children
                    counts += [1] * len(children)
                    extended += children
                proposals += len(extended)
                await step_all(extended)
                # reweight: identical candidates become one, with summed weight and count
                candidates, counts = merge_counted(candidates, counts)
                w = log_weights(candidates)
                # down-sample to at most N distinct candidates, then share out the N slots
                keep, new_w = steer_downsample(w, n, rng)
                particles = [candidates[i] for i in keep.tolist()]
                for p, lw in zip(particles, new_w.tolist()):
                    p.weight = lw
                live = [not p.done_stepping() for p in particles]
                slots = allocate_slots(new_w, [counts[i] for i in keep.tolist()], live, n)
                resampled = len(candidates) > len(keep)
                history.append(
                    StepRecord(
                        len(history) + 1,
                        ess(w),
                        resampled,
                        keep if resampled else None,
                        logsumexp(w) - math.log(n),
                        sum(live),
                    )
                )
                if recorder is not None:
                    step = history[-1]
                    parents = None if kept is None else [kept[origin[id(c)]] for c in candidates]
                    recorder.step(
                        step.step, candidates, w, step.ess, step.log_ml, step.ancestors, parents
                    )
                kept = keep.tolist()
                bar.update(candidates=len(candidates), live=sum(live))
    finally:
        bar.close()
    w = log_weights(particles)
    stats = counters.finish(steps=len(history), n_particles=n, n_beam=k, proposals=proposals)
    log_ml = logsumexp(w) - math.log(n)
    record = None if recorder is None else recorder.finish(particles, w, log_ml, kept)
    return SMCResult(particles, w, log_ml, history, stats, "smc_steer", record=record)
