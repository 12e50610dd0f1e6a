"""``smc_steer``: SMC steering, Algorithm 1 of the LLaMPPL paper.

The population is N *slots*. Every step each live slot is extended ``n_beam`` = K
times (N·K proposals while N slots are live; finished particles are carried once
with their weight); the candidates are down-sampled to N without replacement
(Fearnhead & Clifford 2003) by :func:`steer_downsample`, and the loop repeats::

    extend → reweight (merge identical candidates) → down-sample → StepInfo

(the :class:`Steering` engine; the shared loop of :mod:`llamppl.inference.steps` derives the
history, the run record and the progress bar from each ``StepInfo``.)

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

Resample-move (``move=``, :mod:`llamppl.inference.moves`). The intermediate target of
steering is the same Feynman–Kac path target γ_t as ``smc_standard``'s: candidates are drawn
from M_t and weighted by G_t, and the down-sampling is an unbiased resampling (every
candidate's expected new weight is its weight), so the kept particles with their unequal
weights are properly weighted for γ_t. A π_t-invariant kernel applied to each kept particle,
weight unchanged, keeps them so. A merged particle stands for several paths to one state; the
kernel needs one path of that state drawn from π_t(path | state), so the trail it moves is
drawn among the merged candidates' trails ∝ their weights. Its slots are unchanged: the
children it gets next step are drawn from its moved state. Moves happen after the steps that
down-sampled (more candidates than N), or after every step with ``every_step=True``, the
schedule fixed in advance under which Ẑ stays exactly unbiased (the move never touches a
particle done before the step, so stopping when all are done is exact too; module docstring
of :mod:`llamppl.inference.moves`).

    result = await smc_steer(model, n_particles=8, n_beam=3, seed=0)
    result = await smc_steer(model, 8, 3, move=ResampleMove(k=2, every_step=True), seed=0)
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from llamppl.modeling import Model
from llamppl.validation import check_positive_int
from llamppl.weights import logsumexp

from .engine import Engine
from .moves import Rejuvenation, ResampleMove, Trail, check_move
from .options import DEFAULT_MAX_STEPS, run_options
from .particles import check_model, group_indices, log_weights, merge_counted, step_all
from .result import SMCResult
from .step_info import StepInfo, step_info
from .steps import run_population

__all__ = ["smc_steer", "Steering", "steer_downsample", "allocate_slots"]


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


class Steering(Engine):
    """The SMC steering engine (see the module docstring): N slots, K extensions per slot.

    Carries between steps what the population does not: ``slots`` (how many of the N
    slots each particle fills) and ``proposals`` (extensions made).
    """

    name = "smc_steer"

    def __init__(self, n: int, n_beam: int, move: ResampleMove | None = None) -> None:
        self.n, self.k = n, n_beam
        move = check_move(move)
        self.rejuvenation = None if move is None else Rejuvenation(move)
        self.population_factor = n_beam * (1 if move is None else move.population_factor)
        self.slots: list[int] | None = None
        self.proposals = 0
        self.trails: list[Trail] | None = None  # aligned with the population (moves only)

    async def step(
        self, particles: list[Model], t: int, rng: np.random.Generator
    ) -> tuple[list[Model], StepInfo]:
        n, k = self.n, self.k
        rj = self.rejuvenation
        tracks = rj is not None and rj.tracks
        if self.slots is None:  # step one: the N clones are one state filling N slots
            particles, self.slots = merge_counted(particles, [1] * len(particles))
        trails = self.trails or [()] * len(particles)
        saved = rj.save(particles) if tracks else None  # states before the step (moves)
        # extend: a particle filling m slots gets m·K children of weight w/(m·K)
        candidates, origins, extended = [], [], []
        for j, (p, m) in enumerate(zip(particles, self.slots)):
            children = [p] if p.done_stepping() else [p] + [p.clone() for _ in range(m * k - 1)]
            if not p.done_stepping():
                for c in children:
                    c.weight -= math.log(m * k)
                extended += children
            candidates += children
            origins += [j] * len(children)
        self.proposals += len(extended)
        before = [c.weight for c in candidates]
        await step_all(extended)
        # reweight: identical candidates become one, with summed weight and count
        origin = {id(c): j for c, j in zip(candidates, origins)}
        groups = group_indices(candidates)
        if tracks:  # each candidate's trail, then one per merged group, drawn ∝ weight
            trails = rj.record(
                [trails[j] for j in origins], [saved[j] for j in origins], before, candidates
            )
            trails = rj.pick(trails, groups, log_weights(candidates), rng)
        candidates, counts = merge_counted(candidates, [1] * len(candidates), groups)
        w = log_weights(candidates)
        # down-sample to at most N distinct candidates, then share out the N slots
        keep, new_w = steer_downsample(w, n, rng)
        particles = [candidates[i] for i in keep.tolist()]
        for p, lw in zip(particles, new_w.tolist()):
            p.weight = lw
        resampled = len(candidates) > len(keep)
        if rj is not None:  # move: MH on the last k steps of each kept particle, weights kept
            trails = [trails[i] for i in keep.tolist()] if tracks else [()] * len(particles)
            particles, trails = await rj.after(particles, trails, resampled, rng)
            self.trails = trails if tracks else None
        live = [not p.done_stepping() for p in particles]
        self.slots = allocate_slots(new_w, [counts[i] for i in keep.tolist()], live, n)
        info = step_info(
            t,
            w,
            candidates,
            survivors=particles,
            ancestors=keep if resampled else None,
            n_slots=n,
            origins=[origin[id(c)] for c in candidates],
        )
        return particles, info

    def stats(self) -> dict[str, Any]:
        moves = {} if self.rejuvenation is None else self.rejuvenation.stats()
        return {"n_beam": self.k, "proposals": self.proposals, **moves}


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
    max_steps: int | None = DEFAULT_MAX_STEPS,
    move: ResampleMove | None = None,
) -> SMCResult:
    """SMC steering (LLaMPPL Algorithm 1): K = ``n_beam`` extensions per slot, down-sampled to N.

    Returns an ``SMCResult`` with ``log_ml = log (1/N) Σ_i w_i``, whose exponential Ẑ is an
    unbiased estimate of Z. The result holds N distinct particles whenever at least N distinct
    extensions with positive weight exist. ``stats["proposals"]`` counts the extensions made
    (N·K per step while N slots are live). ``json_file`` / ``visualization_dir`` write a run
    record (the candidates of every step and the kept ones; :mod:`llamppl.inference.record`);
    ``record=True`` keeps it on ``SMCResult.record`` (``record=path`` also writes it); paths
    are checked before the run. ``max_steps`` (default 10,000, None for none) bounds the run:
    particles still stepping after it raise :class:`~llamppl.inference.steps.StepLimitError`
    (naming the model and the step; ``.result`` holds the run so far). A run whose N·K
    candidates would not fit in the available memory is refused before it starts.
    ``move=ResampleMove(k, sweeps, every_step)`` rejuvenates the kept particles after each
    down-sampling (or every step) by a Metropolis–Hastings move on their last ``k`` steps that
    leaves the intermediate target γ_t invariant (module docstring; :mod:`llamppl.inference.moves`);
    ``stats`` then also holds the acceptance rate and the distinct particles before and after
    each move.
    """
    check_model(model)
    n = check_positive_int("n_particles", n_particles)
    k = check_positive_int("n_beam", n_beam)
    options = run_options(
        seed=seed,
        progress=progress,
        record=record,
        max_steps=max_steps,
        json_file=json_file,
        visualization_dir=visualization_dir,
    )
    return await run_population(model, n, Steering(n, k, move), options)
