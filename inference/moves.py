"""Resample-move: an MCMC move that rejuvenates particles after resampling (Gilks & Berzuini 2001).

After resampling, many particles are copies of a few ancestors. Resample-move applies to each
particle a Markov kernel K_t that leaves the current intermediate target π_t invariant; the
copies spread out again while the weights stay as they are (``papers.md`` §6). The kernel here
is the independent Metropolis–Hastings move that suits programs: regenerate a particle's last
``k`` steps with the program's own proposal and accept by the ratio of the tails' incremental
weights::

    from llamppl.inference import ResampleMove, smc_standard, smc_steer
    result = await smc_standard(model, 16, 0.5, move=ResampleMove(k=2), seed=0)
    result.stats["move_acceptance"], result.stats["distinct_after_move"]
    result = await smc_steer(model, 8, 3, move=ResampleMove(k=2, every_step=True), seed=0)

**The intermediate target.** Write x_{0:t} for a particle's path of states after t engine steps
(x_0 after ``start``), M_i for the transition one ``step`` makes (every ``sample`` drawn from its
proposal, ``observe``/``condition`` ignored) and G_i for the potential it scores (LLaMPPL §2.3:
proposal ratios × likelihoods × condition indicators × twists). A finished or dead particle is
absorbing: M_i = δ, G_i = 1. The Feynman–Kac path target after step t is

    γ_t(x_{0:t}) = ∏_{i=1}^{t} M_i(x_i | x_{i-1}) G_i(x_{i-1}, x_i),      π_t = γ_t / Z_t.

Twists are part of G_i, so π_t is the *twisted* intermediate target (Twisted SMC, Zhao et al.
2024: π_t ∝ p₀(s_{1:t}) ψ_t(s_{1:t})); at the end the twists are undone and π_T is the posterior.

**The kernel** (window L = min(k, t)). Keep x_{0:t-L}; draw a new tail x'_{t-L+1:t} from
Q(x'_tail) = ∏_{i>t-L} M_i(x'_i | x'_{i-1}), starting at x_{t-L}, by re-running ``step`` L times
on a copy of the particle saved before step t-L+1; accept it with probability

    α = min(1, [π_t(x') / Q(x'_tail)] / [π_t(x) / Q(x_tail)]).

Both paths share the prefix, so π_t(x)/Q(x_tail) = γ_t(x_{0:t-L}) · ∏_{i>t-L} G_i(x_{i-1}, x_i) / Z_t
(the tail's M_i cancel against Q), and

    α = min(1, ∏_{i>t-L} G_i(x') / ∏_{i>t-L} G_i(x)) = min(1, exp(Σ_tail log G' − Σ_tail log G)):

the product of the tail's incremental importance weights, proposed over current. This is
Metropolis–Hastings with an independent proposal for the conditional π_t(x_tail | x_{0:t-L}), so
it satisfies detailed balance for that conditional and leaves π_t invariant. Each particle keeps
a :class:`Trail`: for each of its last k steps, a copy of its state before the step and the
step's log G (the change of its weight across the step, measured before any resampling resets
the weight). Particles of weight zero are not moved.

**Particles that finish.** A finished or dead particle is absorbing, and the run stops at the
first step τ after which every particle is done. Split the paths at step t by when they ended:
B_t, the paths still running after step t or that finished at step t itself, and A_t, the paths
done before step t. The kernel keeps to these sets: a path in A_t is never moved, and a proposal
that ends before the window's last step (it lands in A_t) is rejected, α = 0. On B_t it is the
Metropolis–Hastings move above for π_t restricted to B_t (given the prefix), with the proposals
outside B_t rejected, so it leaves π_t(· | B_t) and π_t(· | A_t) invariant, hence π_t. A particle
that finished at step t may be moved to a path still running (it is re-opened, and the run goes
on), as may a running one to a path that finishes at step t: that happens inside step t, before
the loop asks whether everyone is done.

Why this makes stopping at τ exact. Run the fixed schedule (``every_step=True``) to any step
T ≥ τ instead. After τ every particle is in A_t: the steps extend nothing, nothing is resampled
(there is nothing left to step) and every move leaves every particle where it is. So the
population at T *is* the population at τ, and what the run returns is the fixed schedule's
population at T, properly weighted for γ_T. Without the split, a move after τ could re-open a
particle that finished inside its window (k >= 2), so stopping at τ skipped exactly the moves
that would have changed the population: the schedule depended on the particles, and a 3-step
program whose particles end at step 1 (probability 0.8) or 3 had E[Ẑ] 9 standard errors low
and the early ending's mass 18 high over 4,000 seeds (``tests/inference/test_move_schedule.py``
checks this program and another). The other cure, moving on after τ until no window can re-open
anything (k − 1 more moves, and more whenever a move re-opens a particle), is exact too but runs
extra sweeps at the end of every run and lengthens the texts it re-opens; the split costs
nothing and moves only fewer paths (those that ended inside the window but before its last step).
With k = 1 the window is one step and nothing changes: no path in B_t ended before step t.

**Weights stay; Ẑ stays unbiased.** If the weighted particles (x^i, w^i) are properly weighted
for γ_t, E[(1/N) Σ_i w^i f(x^i)] = γ_t(f) for every f (true of SMC with any resampling rule, and
of steering's down-sampling, which is unbiased per candidate), then moving each particle by K_t
and keeping its weight gives E[(1/N) Σ_i w^i f(x'^i)] = γ_t(K_t f) = γ_t(f): the population stays
properly weighted, whether or not it was just resampled, and the later steps keep Ẑ unbiased.
This needs *whether* to move at step t fixed before the run: ``every_step=True`` moves after
every step and is exact for every engine (with the stopping argument above). The default moves
only after the steps that resampled (Gilks & Berzuini's resample-move). Resampling itself may
be decided from the weights (it is unbiased given the population), but a move is unbiased only
on average over π_t: applying it to populations selected by their own weights biases E[Ẑ] by a
term that vanishes as N grows (the posterior stays consistent). Measured on four small programs
whose particles finish at different steps (``benchmarks/bench_move_schedule.py``,
``benchmarks/reports/move_schedule.md``, k = 2, ``smc_standard``): with ``ess_threshold=0.5``
within ±1.5 % of Z at N = 4, 16 and 64 (at most 2.6 standard errors; +0.8 %, +0.8 % and +0.9 %
on the program where it moves most). The two schedules coincide only for a rule that resamples
at every step whatever the weights; ``ess_threshold=1.0`` is not one (it skips resampling when
every weight is equal, ESS = N), and with it the default schedule is +8.8 % at N = 2 and +5.1 %
at N = 4 on that program (12 and 6 standard errors).

**Random weights.** A step whose G is an unbiased estimate (``HardConstraint``'s lazy proposal,
whose pair (token, Ẑ) is properly weighted) is a step on an extended space that includes the
draw's auxiliary randomness, with the same marginal over states. The move keeps the current
tail's recorded weights and compares them with the proposal's fresh ones, which is
Metropolis–Hastings on that extended space (a pseudo-marginal move), so it is exact there too.

**Cost.** Every step saves one copy of each live particle (``Model.clone``: LMs and their trie
are shared, not copied), and each sweep of a move runs L steps of every movable particle;
all particles' proposals step together, so their LM requests are one batch per step, as in
the engine's own steps. Nothing here reads a tensor: weights are the particles' floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llamppl.modeling import Model
from llamppl.validation import check_nonnegative_int, check_positive_int

from .particles import step_all

__all__ = ["ResampleMove", "Rejuvenation", "Link", "Trail", "check_move", "distinct"]


@dataclass(frozen=True)
class Link:
    """One step of a particle's trail: its ``state`` before the step (a copy that is never
    stepped) and the step's ``log_g`` (log G_i; 0 for an absorbing step)."""

    state: Model
    log_g: float


#: A particle's last (at most k) steps, oldest first. Shared, never mutated, between a
#: particle and its copies: resampling a particle copies its trail by reference.
Trail = tuple[Link, ...]


@dataclass(frozen=True)
class ResampleMove:
    """Resample-move rejuvenation: an independent Metropolis–Hastings move on the last ``k`` steps
    (module docstring), given to an engine as ``move=``.

    Parameters
    ----------
    k : int
        Steps regenerated per move (>= 1); fewer in the first k - 1 steps.
    sweeps : int
        Metropolis–Hastings proposals per particle per move (>= 0). ``sweeps=0`` moves nothing
        and saves no trails but still counts the distinct particles (``SMCResult.stats``), the
        baseline of a diversity comparison; the run is then the run without ``move=``.
    every_step : bool
        Move after every step, not only after the steps that resample. Exact (Ẑ unbiased,
        the posterior exact) with every engine and rule, also when particles finish at
        different steps; the default, after resampling only, is exact only as N grows (its
        measured bias is in the module docstring).
    """

    k: int = 1
    sweeps: int = 1
    every_step: bool = False

    def __post_init__(self) -> None:
        check_positive_int("ResampleMove k", self.k)
        check_nonnegative_int("ResampleMove sweeps", self.sweeps)
        if not isinstance(self.every_step, bool):
            raise TypeError(
                f"ResampleMove every_step must be True or False, got {self.every_step!r}"
            )

    @property
    def population_factor(self) -> int:
        """Copies of each particle alive at once: itself, k saved states and one proposal."""
        return 1 if self.sweeps == 0 else self.k + 2


def _ended_before_last(trail: Trail) -> bool:
    """Whether the path was done before the last step of its window (it finished or died at an
    earlier step of the window, or before it): such a path is never moved, nor moved to."""
    return trail[-1].state.done_stepping()


def check_move(move: object) -> ResampleMove | None:
    """``move=`` of an engine: a :class:`ResampleMove` or None (``TypeError`` otherwise)."""
    if move is not None and not isinstance(move, ResampleMove):
        raise TypeError(
            f"move must be a ResampleMove (e.g. ResampleMove(k=2)) or None, got {type(move).__name__}"
        )
    return move


def distinct(particles: Sequence[Model]) -> int:
    """Distinct posterior keys (``string_for_serialization()``) among particles of positive weight."""
    return len({p.string_for_serialization() for p in particles if p.weight > -math.inf})


class Rejuvenation:
    """The run state of a :class:`ResampleMove` inside an engine: records trails, moves, counts.

    An engine calls, each step::

        saved = rejuvenation.save(parents)            # before stepping: copies of the states
        ... step the population (weights split, if any, before reading ``before``) ...
        trails = rejuvenation.record(trails, saved_per_particle, before, particles)
        ... resample, carrying trails along with the particles ...
        particles, trails = await rejuvenation.after(particles, trails, resampled, rng)

    Trails are lists aligned with the population; the engine maps them through resampling
    exactly as it maps the particles.
    """

    def __init__(self, move: ResampleMove) -> None:
        self.move = move
        self.moves = 0
        self.proposals = 0
        self.accepted = 0
        self.program_steps = 0
        self.saved_states = 0
        self.distinct_before: list[int] = []
        self.distinct_after: list[int] = []

    @property
    def tracks(self) -> bool:
        """Whether trails are kept (not for ``sweeps=0``, which only counts)."""
        return self.move.sweeps > 0

    def save(self, particles: Sequence[Model]) -> list[Model]:
        """Each particle's state before a step: a copy of a live one, the particle itself when it
        is done (it never changes again)."""
        out = []
        for p in particles:
            if p.done_stepping():
                out.append(p)
            else:
                out.append(p.clone())
                self.saved_states += 1
        return out

    def record(
        self,
        trails: Sequence[Trail],
        saved: Sequence[Model],
        before: Sequence[float],
        particles: Sequence[Model],
    ) -> list[Trail]:
        """Each particle's trail after a step: its ``saved`` state and log G = weight now −
        weight ``before`` the step (0 when it was already dead), the oldest links beyond k
        dropped."""
        k = self.move.k
        out = []
        for trail, state, w0, p in zip(trails, saved, before, particles):
            log_g = 0.0 if w0 == -math.inf else p.weight - w0
            out.append((*trail, Link(state, log_g))[-k:])
        return out

    def pick(
        self,
        trails: Sequence[Trail],
        groups: Sequence[Sequence[int]],
        log_weights: np.ndarray,
        rng: np.random.Generator,
    ) -> list[Trail]:
        """One trail per group of merged particles, drawn ∝ the members' weights.

        A merged particle (``smc_steer``) stands for several paths to one state; the kernel
        needs a path of the state drawn from π_t(path | state), which a draw ∝ weight is.
        """
        out = []
        for members in groups:
            if len(members) == 1:
                out.append(trails[members[0]])
                continue
            w = log_weights[list(members)]
            top = w.max()
            if top == -math.inf:
                out.append(trails[members[0]])
                continue
            p = np.exp(w - top)
            j = int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"))
            out.append(trails[members[min(j, len(members) - 1)]])
        return out

    async def after(
        self,
        particles: list[Model],
        trails: list[Trail],
        resampled: bool,
        rng: np.random.Generator,
    ) -> tuple[list[Model], list[Trail]]:
        """Move the population if this step is due (it resampled, or ``every_step``)."""
        if not (resampled or self.move.every_step):
            return particles, trails
        self.moves += 1
        self.distinct_before.append(distinct(particles))
        particles, trails = list(particles), list(trails)
        for _ in range(self.move.sweeps):
            await self._sweep(particles, trails, rng)
        self.distinct_after.append(distinct(particles))
        return particles, trails

    async def _sweep(
        self, particles: list[Model], trails: list[Trail], rng: np.random.Generator
    ) -> None:
        """One Metropolis–Hastings proposal for every movable particle, all stepped together."""
        movable = [  # live paths whose window starts running and that were running at step t
            i
            for i, (p, trail) in enumerate(zip(particles, trails))
            if trail and p.weight > -math.inf and not _ended_before_last(trail)
        ]
        if not movable:
            return
        starts = [trails[i][0].state for i in movable]
        lengths = [len(trails[i]) for i in movable]
        proposals = [s.clone() for s in starts]
        new_trails: list[list[Link]] = [[] for _ in movable]
        for j in range(max(lengths)):
            active = [a for a, n in enumerate(lengths) if j < n]
            saved = [
                starts[a] if j == 0 else self.save([proposals[a]])[0] for a in active
            ]  # the state before this step: the start itself first, then copies
            before = [proposals[a].weight for a in active]
            stepping = [proposals[a] for a in active if not proposals[a].done_stepping()]
            self.program_steps += len(stepping)
            await step_all(stepping)  # every particle's proposal in one LM batch
            for a, state, w0 in zip(active, saved, before):
                w1 = proposals[a].weight
                new_trails[a].append(Link(state, 0.0 if w0 == -math.inf else w1 - w0))
        # log α = Σ_tail log G(x') − Σ_tail log G(x), or −inf for a proposal outside the set
        # the move keeps to: one that ended before the window's last step (module docstring)
        new = np.array([sum(link.log_g for link in t) for t in new_trails])  # (M,)
        old = np.array([sum(link.log_g for link in trails[i]) for i in movable])  # (M,)
        early = np.array([_ended_before_last(tuple(t)) for t in new_trails], dtype=bool)  # (M,)
        with np.errstate(invalid="ignore"):
            log_alpha = np.where((new == -np.inf) | early, -np.inf, new - old)  # (M,)
        log_u = np.log(rng.random(len(movable)))  # (M,), one draw per proposal
        accept = log_u < log_alpha  # (M,) bool
        self.proposals += len(movable)
        self.accepted += int(accept.sum())
        for a, i in enumerate(movable):
            if accept[a]:
                proposals[a].weight = particles[i].weight  # the weight is not changed
                particles[i] = proposals[a]
                trails[i] = tuple(new_trails[a])

    def stats(self) -> dict[str, Any]:
        """Entries for ``SMCResult.stats``: the move's settings, work counts, acceptance rate
        and the distinct particles before and after each move."""
        return {
            "move_k": self.move.k,
            "move_sweeps": self.move.sweeps,
            "move_every_step": self.move.every_step,
            "moves": self.moves,
            "move_proposals": self.proposals,
            "move_accepted": self.accepted,
            "move_acceptance": self.accepted / self.proposals if self.proposals else 0.0,
            "move_program_steps": self.program_steps,
            "move_saved_states": self.saved_states,
            "distinct_before_move": list(self.distinct_before),
            "distinct_after_move": list(self.distinct_after),
        }
