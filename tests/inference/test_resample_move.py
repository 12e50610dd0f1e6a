"""Resample-move (``move=ResampleMove(...)``) against the exact oracle.

- Invariance. Particles stepped t times by importance sampling (proposal M, weight ∏ G) are
  properly weighted for the path target γ_t: E[(1/M) Σ_i w_i 1{x_i ∈ B}] = γ_t(B). After one move
  of every particle, weights kept, the same holds with x'_i iff the kernel leaves π_t invariant.
  γ_t(B) is exact: ``enumerate_exact(model, max_steps=t)`` (its still-running paths are the
  intermediate states, twists included). Each bin B of states (at least ``BIN_MASS`` of π_t) is
  checked within 4 measured standard errors of the M i.i.d. terms w_i 1{x'_i ∈ B}. The move
  must also do something: its acceptance rate lies strictly between 0 and 1, and moved
  particles land on other states.
- Ẑ unbiased over seeded runs (4 measured standard errors) with the move after every step
  (the schedule fixed in advance, exact for both engines).
- Posterior TV falls with N with the move on, after resampling (the default schedule).
- The moves batch: each step of a sweep is one LM call for the whole population.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from programs import PROGRAMS, exp_or_zero, total_variation, toy_lm

from llamppl import Bernoulli, Categorical, FunctionLM, LMContext, Model, run
from llamppl.inference import (
    SMC,
    Never,
    ResampleMove,
    enumerate_exact,
    smc_standard,
    smc_steer,
)
from llamppl.inference.moves import Rejuvenation
from llamppl.models import HardConstraint
from llamppl.rng import using_rng
from tests.models.exact_reference import mass_bins

BIN_MASS = 0.05
M = 1500  # particles of the invariance check
RUNS = 200  # seeded runs of the unbiasedness check (N = 4)

# ---------------------------------------------------------------- a lazy HardConstraint
LAZY_VOCAB = [chr(ord("a") + i) for i in range(8)] + ["ab", "ba", "<eos>"]
LAZY_EOS = len(LAZY_VOCAB) - 1
LAZY_LM = FunctionLM(
    LAZY_VOCAB,
    LAZY_EOS,
    lambda ctx: [0.4 * math.sin(1.3 * i + len(ctx)) for i in range(LAZY_EOS)] + [len(ctx) - 2.5],
)


def _alternating(text: str) -> bool:
    """About half the letters allowed at each position (a plain callable: the lazy proposal)."""
    return all((ord(ch) + i) % 2 == 0 for i, ch in enumerate(text))


def lazy_program(lm=None) -> HardConstraint:
    model = HardConstraint(LAZY_LM, [0], _alternating, max_tokens=3)
    assert model.proposal == "lazy"
    return model


class SumProgram(Model):
    """The state is a running sum, so paths with different weights meet in one state, which
    ``smc_steer`` merges: its move must draw the merged paths' trail ∝ weight."""

    def __init__(self) -> None:
        super().__init__()
        self.total = self.t = 0

    async def step(self) -> None:
        x = await self.sample(Categorical([0.5, 0.3, 0.2]))
        self.score((0.9 if self.t % 2 == 0 else -0.7) * x)
        self.total, self.t = self.total + x, self.t + 1
        if self.t == 3:
            self.finish()


CASES = {**{name: (lambda cls=cls: cls(toy_lm())) for name, cls in PROGRAMS.items()}}
CASES["hard-lazy"] = lazy_program
CASES["sum"] = SumProgram


def key(p) -> tuple:
    return (p.string_for_serialization(), p.finished)


def exact_gamma(model, t: int) -> dict:
    """γ_t over keys: the exact unnormalised intermediate target after t steps."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "stopped after max_steps": that is the point
        exact = run(enumerate_exact(model, max_steps=t))
    out: dict = {}
    for p, lw in zip(exact.particles, exact.log_weights):
        if lw > -math.inf:
            out[key(p)] = out.get(key(p), 0.0) + math.exp(float(lw))
    return out


async def _stepped_then_moved(model, m: int, t: int, move: ResampleMove, seed: int):
    """M particles after t importance-sampling steps, and the same after one move."""
    engine = SMC(Never(), "importance_sampling", move)
    rng = np.random.default_rng(seed)
    with using_rng(rng):
        particles = await engine.start([model.clone() for _ in range(m)])
        for s in range(1, t + 1):
            particles, _ = await engine.step(particles, s, rng)
        before, trails = list(particles), list(engine.trails)
        moved, new_trails = await engine.rejuvenation.after(particles, engine.trails, True, rng)
    return before, moved, engine.rejuvenation, (trails, new_trails)


def assert_properly_weighted(particles, gamma: dict, label: str) -> None:
    w = np.array([math.exp(p.weight) if p.weight > -math.inf else 0.0 for p in particles])
    keys = [key(p) for p in particles]
    stray = {k for k, wi in zip(keys, w) if wi > 0 and k not in gamma}
    assert not stray, f"{label}: weight on states outside the target: {sorted(stray)[:3]}"
    for i, members in enumerate(mass_bins(gamma, BIN_MASS)):
        terms = np.array([wi if k in members else 0.0 for k, wi in zip(keys, w)])  # (M,)
        expected = sum(gamma[k] for k in members)
        se = terms.std(ddof=1) / math.sqrt(len(terms))
        gap = abs(terms.mean() - expected)
        assert gap <= 4 * se + 1e-12, (
            f"{label} bin {i} ({len(members)} states): mean {terms.mean():.5g}, exact "
            f"{expected:.5g}, {gap / se:.1f} standard errors off"
        )


INVARIANCE = [
    ("condition", 3, 2),
    ("observe", 2, 2),
    ("twist", 2, 2),
    ("proposal", 3, 1),
    ("hard-lazy", 2, 2),
]
UNBIASED = [
    *(("smc_standard", c) for c in ("observe", "twist", "hard-lazy")),
    *(("smc_steer", c) for c in ("twist", "sum")),
]


@pytest.mark.parametrize(("case", "t", "k"), INVARIANCE)
def test_the_move_leaves_the_intermediate_target_invariant(case, t, k):
    model = CASES[case]()
    gamma = exact_gamma(model, t)
    before, moved, rj, trails = run(_stepped_then_moved(model, M, t, ResampleMove(k=k), seed=1))
    assert_properly_weighted(before, gamma, "before the move")
    assert_properly_weighted(moved, gamma, "after the move")
    assert 0 < rj.accepted < rj.proposals, (rj.accepted, rj.proposals)
    # a path done before step t is never moved, and no path moves to one done before step t
    for a, b, old, new in zip(before, moved, *trails):
        assert b is a if old[-1].state.done_stepping() else not new[-1].state.done_stepping()
    changed = sum(key(a) != key(b) for a, b in zip(before, moved) if a.weight > -math.inf)
    assert changed >= M // 20, changed


def _smc_move(n, seed, model):
    return smc_standard(model, n, 0.5, move=ResampleMove(k=2, every_step=True), seed=seed)


def _steer_move(n, seed, model):
    return smc_steer(model, max(1, n // 2), 2, move=ResampleMove(k=2, every_step=True), seed=seed)


ENGINES = {"smc_standard": _smc_move, "smc_steer": _steer_move}


@pytest.fixture(scope="module")
def exact():
    return {name: run(enumerate_exact(make())) for name, make in CASES.items()}


def test_a_merged_state_moves_along_a_path_drawn_in_proportion_to_its_weight():
    """``smc_steer`` merges paths that meet in one state; the move needs one of them drawn
    from π_t(path | state), i.e. ∝ the paths' weights."""
    rj = Rejuvenation(ResampleMove(k=1))
    trails = [("a",), ("b",), ("c",), ("d",)]
    log_w = np.log(np.array([0.1, 0.6, 0.3, 1.0]))
    rng = np.random.default_rng(0)
    draws = 20_000
    counts = {"a": 0, "b": 0, "c": 0}
    for _ in range(draws):
        picked = rj.pick(trails, [[0, 1, 2], [3]], log_w, rng)
        assert picked[1] == ("d",)
        counts[picked[0][0]] += 1
    for name, p in zip("abc", (0.1, 0.6, 0.3)):
        se = math.sqrt(p * (1 - p) / draws)
        assert abs(counts[name] / draws - p) <= 4 * se, (counts, name)


def runs(make, seeds) -> list:
    """Seeded runs, one after another in one event loop (``run`` per result costs a loop each)."""

    async def all_of_them():
        return [await make(seed) for seed in seeds]

    return run(all_of_them())


@pytest.mark.parametrize(("engine", "case"), UNBIASED)
def test_z_hat_stays_unbiased_with_the_move(exact, case, engine):
    results = runs(lambda seed: ENGINES[engine](4, seed, CASES[case]()), range(RUNS))
    assert sum(r.stats["move_accepted"] for r in results) > RUNS  # the move really moved
    z_hats = np.array([exp_or_zero(r.log_ml) for r in results])
    z = math.exp(exact[case].log_ml)
    se = z_hats.std(ddof=1) / math.sqrt(RUNS)
    assert abs(z_hats.mean() - z) <= 4 * se + 1e-12, (z_hats.mean(), z, se)


@pytest.mark.parametrize("case", ["observe", "twist"])
def test_posterior_tv_falls_with_n_with_the_move_after_resampling(exact, case):
    def mean_tv(n, seeds):
        runs = [
            run(smc_standard(CASES[case](), n, 1.0, move=ResampleMove(k=2), seed=s)) for s in seeds
        ]
        assert sum(r.stats["moves"] for r in runs) > 0
        return np.mean([total_variation(r.posterior, exact[case].posterior) for r in runs])

    small, large = mean_tv(4, range(30)), mean_tv(64, range(100, 110))
    assert large < small / 2, (small, large)


def test_the_moves_of_all_particles_share_each_lm_call():
    lm = toy_lm()
    model = PROGRAMS["condition"](lm)
    move = ResampleMove(k=2, sweeps=3)
    engine = SMC(Never(), "importance_sampling", move)
    rng = np.random.default_rng(0)

    async def go():
        with using_rng(rng):
            particles = await engine.start([model.clone() for _ in range(32)])
            for s in (1, 2):
                particles, _ = await engine.step(particles, s, rng)
            calls = lm.stats.forward_calls
            await engine.rejuvenation.after(particles, engine.trails, True, rng)
            return lm.stats.forward_calls - calls

    calls = run(go())
    assert engine.rejuvenation.program_steps > 3 * 32  # many particles stepped per sweep...
    assert 1 <= calls <= move.k * move.sweeps  # ...in one LM call per step of a sweep


def test_zero_sweeps_is_the_run_without_a_move_and_counts_distinct_particles():
    model = PROGRAMS["observe"](toy_lm())
    plain = run(smc_standard(model, 16, 1.0, seed=3))
    counted = run(smc_standard(model, 16, 1.0, move=ResampleMove(sweeps=0), seed=3))
    assert counted.log_ml == plain.log_ml
    assert [str(p) for p in counted] == [str(p) for p in plain]
    resamplings = sum(s.resampled for s in plain.history)
    assert counted.stats["moves"] == resamplings > 0
    assert counted.stats["distinct_before_move"] == counted.stats["distinct_after_move"]
    assert counted.stats["move_proposals"] == counted.stats["move_saved_states"] == 0


class Sentence(Model):
    """Eight tokens of the toy LM, each observed through a likelihood that favours "a" and "c":
    long enough that resampling leaves copies."""

    def __init__(self, lm) -> None:
        super().__init__()
        self.context = LMContext(lm, [0])

    async def step(self) -> None:
        token = await self.sample(self.context.next_token())
        await self.observe(Bernoulli(0.9 if int(token) in (0, 2) else 0.2), True)
        if len(self.context.generated) >= 8:
            self.finish()


def test_the_move_spreads_copies_out_after_resampling():
    model = Sentence(toy_lm())
    result = run(smc_standard(model, 32, 0.5, move=ResampleMove(k=2), seed=0))
    s = result.stats
    assert s["moves"] > 0 and 0 < s["move_acceptance"] < 1
    assert s["move_program_steps"] > 0 and s["move_saved_states"] > 0
    assert sum(s["distinct_after_move"]) > sum(s["distinct_before_move"]), s


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"k": 0}, ValueError, "k"),
        ({"k": 1.5}, TypeError, "k"),
        ({"sweeps": -1}, ValueError, "sweeps"),
        ({"every_step": "yes"}, TypeError, "every_step"),
    ],
)
def test_bad_moves_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        ResampleMove(**kwargs)


@pytest.mark.parametrize("engine", [smc_standard, lambda m, n, **kw: smc_steer(m, n, 2, **kw)])
def test_a_move_that_is_not_a_resample_move_is_refused(engine):
    with pytest.raises(TypeError, match="move must be a ResampleMove"):
        run(engine(PROGRAMS["condition"](toy_lm()), 4, move=2))
