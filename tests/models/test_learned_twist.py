"""Twists of one's own and learned twists: they cancel (same posterior, same Z) and can help.

Twisted SMC (``papers.md`` §6): Z stays unbiased for any positive twist, because a program
adds log ψ_t − log ψ_{t-1} at each step and divides the last ψ out at the end. Tested here:

- ``HardConstraint(..., twist=fn)`` with an arbitrary (pseudo-random) twist: the exact
  enumeration is the sampling target to 1e-9, seeded SMC runs are unbiased for Z and for the
  posterior mass of every bin of paths (:func:`exact_reference.assert_unbiased_paths`), and
  the posterior's total variation falls with N;
- a learned twist (:func:`~llamppl.inference.twist_learning.learn_twist`) in a program of
  one's own (``Model.twist`` through ``retwist``): E[Ẑ] = Z within 4 measured SEs, and the
  variance of log Ẑ is lower than without it (by more than 4 SEs of the difference);
- the learned twist through ``HardConstraint(twist=learned)`` with a plain callable;
- save / load, bad input, and the LM's hidden state (no second pass).
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch
from exact_reference import assert_unbiased_paths, sampling_target, weighted_paths

from llamppl import Bernoulli, FunctionLM, LMContext, Model, run
from llamppl.inference import enumerate_exact, smc_standard
from llamppl.inference.twist_features import (
    Feature,
    TwistFeatures,
    constraint_signals,
    last_token,
    progress,
    repetition,
    text_feature,
)
from llamppl.inference.twist_learning import LearnedTwist, fit_head, learn_twist
from llamppl.models import HardConstraint

# ---------------------------------------------------------------- a constrained toy
VOCAB = ["a", "b", "c", "ab", "\n", "<eos>"]
EOS = 5
MAX_TOKENS = 4


def _logits(ctx):
    n, last = len(ctx), ctx[-1]
    return [math.cos(0.8 * i + 0.5 * n + 0.7 * last) for i in range(EOS)] + [0.4 * n - 1.5]


LM = FunctionLM(VOCAB, EOS, _logits)


def _prefix_ok(text: str) -> bool:
    return text.count("b") <= 2


def _complete_ok(text: str) -> bool:
    return text.count("b") == 2 or text.endswith("c")


def random_twist(model) -> float:
    """A deterministic pseudo-random log ψ in [-3, 3] of the particle's tokens."""
    key = ",".join(map(str, model.context.tokens)).encode()
    return 6.0 * (zlib.crc32(key) % 1000) / 999 - 3.0


def _program(twist, proposal="lazy", prompt=(0,)):
    return HardConstraint(
        LM,
        list(prompt),
        _prefix_ok,
        proposal,
        MAX_TOKENS,
        complete=_complete_ok,
        stop="newline",
        twist=twist,
    )


def _target(prompt=(0,)):
    return sampling_target(LM, list(prompt), _prefix_ok, _complete_ok, {EOS, 4}, MAX_TOKENS)


@pytest.mark.parametrize("proposal", ["sample", "mask", "lazy"])
def test_a_random_twist_leaves_the_exact_posterior_and_z_unchanged(proposal):
    target, z = _target()
    exact = run(enumerate_exact(_program(random_twist, proposal)))
    paths = weighted_paths(exact)
    assert math.exp(exact.log_ml) == pytest.approx(z, abs=1e-9)
    assert paths.keys() == target.keys()
    for path, w in target.items():
        assert paths[path] / sum(paths.values()) == pytest.approx(w, abs=1e-9), path


@pytest.mark.parametrize("proposal", ["mask", "lazy"])
def test_smc_with_a_random_twist_is_unbiased(proposal):
    target, z = _target()
    runs = [run(smc_standard(_program(random_twist, proposal), 3, seed=s)) for s in range(300)]
    assert sum(r.history[i].resampled for r in runs for i in range(len(r.history))) > 100
    assert_unbiased_paths(runs, target, z)


def _tv(result, target) -> float:
    paths = weighted_paths(result)
    total = sum(paths.values())
    if total == 0:
        return 1.0
    keys = set(paths) | set(target)
    return 0.5 * sum(abs(paths.get(k, 0.0) / total - target.get(k, 0.0)) for k in keys)


def test_the_posterior_total_variation_falls_with_n_under_a_random_twist():
    target, _ = _target()
    tvs = {
        n: np.array(
            [_tv(run(smc_standard(_program(random_twist), n, seed=s)), target) for s in range(40)]
        )
        for n in (2, 32)
    }
    gap = tvs[2].mean() - tvs[32].mean()
    se = math.sqrt(sum(t.var(ddof=1) / len(t) for t in tvs.values()))
    assert gap > 4 * se, (tvs[2].mean(), tvs[32].mean(), se)


# ---------------------------------------------------------------- a learned twist that helps
T_REWARD, BETA, STICKY = 8, 2.0, 2.5
REWARD_VOCAB = ["a", "b", "c", "<eos>"]


def _sticky(ctx):
    last = ctx[-1]
    return [STICKY * (last == 0), STICKY * (last == 1), STICKY * (last == 2), -4.0]


STICKY_LM = FunctionLM(REWARD_VOCAB, 3, _sticky)


class Penalised(Model):
    """T tokens of a sticky LM, the final text weighted by exp(−β · its "a"s); an optional
    twist set at every step (``retwist``) and undone at the end."""

    max_tokens = T_REWARD

    def __init__(self, lm, prompt, twist=None) -> None:
        super().__init__()
        self.context = LMContext(lm, list(prompt))
        self.guide = twist

    @property
    def text(self) -> str:
        return str(self.context)

    async def step(self) -> None:
        token = await self.sample(self.context.next_token())
        if token == 3 or len(self.context.generated) >= T_REWARD:
            self.untwist()
            self.score(-BETA * str(self.context).count("a"))
            self.finish()
        elif self.guide is not None:
            await self.guide.retwist(self)


def _reward_features():
    return TwistFeatures(text_feature(lambda t: t.count("a"), "a_count"), progress(), last_token(4))


@pytest.fixture(scope="module")
def learned() -> LearnedTwist:
    prompts = [[0], [2], [0, 2], [2, 0], [0, 0], [2, 2]]  # never the evaluation prompt [1]
    return learn_twist(
        Penalised,
        STICKY_LM,
        prompts,
        _reward_features(),
        n_particles=8,
        ess_threshold=0.0,
        runs_per_prompt=5,
        target="weight",
        seed=0,
        progress=False,
    )


def test_learn_twist_reports_its_data_and_a_held_out_loss_below_the_constant(learned):
    report = learned.report
    assert report.rollouts == 30 and report.trajectories == 240
    assert report.examples > 0 and report.held_out_examples > 0
    assert report.held_out_loss < report.base_loss
    assert sum(n for _, _, n in report.calibration) == report.held_out_examples
    assert report.warnings == [] and report.label_variance > 0.01  # a useful fit says nothing


def _learn_with_warnings(program, **kw):
    with pytest.warns(UserWarning, match="learn_twist") as caught:
        twist = learn_twist(
            program,
            STICKY_LM,
            [[0], [2], [0, 2], [2, 0]],
            _reward_features(),
            n_particles=4,
            runs_per_prompt=2,
            epochs=60,
            seed=0,
            progress=False,
            **kw,
        )
    assert [str(w.message) for w in caught] == twist.report.warnings
    return twist.report


def test_learn_twist_warns_when_every_rollout_succeeds_and_says_what_to_change():
    """Default target "success" on a program whose every particle ends with positive weight:
    every label is 1, and the head cannot beat the constant ψ = 1 on held-out prefixes."""
    report = _learn_with_warnings(Penalised)
    assert report.success_rate == 1.0 and report.label_variance == 0.0
    flat, held = report.warnings
    assert "labels carry no signal" in flat and "target='weight' with ess_threshold=0" in flat
    assert "no better than a constant" in held and f"{report.held_out_loss:.4f}" in held


class CoinEnd(Penalised):
    """Penalised's text, then a fair coin decides success: the labels vary (half succeed) but
    nothing in the prefix predicts them, so a head fitted to them only overfits."""

    max_tokens = 4

    async def step(self) -> None:
        token = await self.sample(self.context.next_token())
        if token == 3 or len(self.context.generated) >= self.max_tokens:
            self.untwist()
            self.condition(bool(await self.sample(Bernoulli(0.5))))
            self.finish()
        else:
            await self.guide.retwist(self)


def test_learn_twist_warns_when_the_head_is_no_better_than_a_constant_held_out():
    report = _learn_with_warnings(CoinEnd)
    assert 0.2 < report.label_mean < 0.8  # the labels have signal ...
    assert report.held_out_loss >= report.base_loss  # ... that the prefixes do not predict
    (held,) = report.warnings
    assert "no better than a constant" in held and "more and more varied" in held


def test_a_learned_twist_keeps_z_unbiased_and_lowers_the_variance_of_log_z(learned):
    """Two particles resampled whenever their weights differ (ESS threshold 1): without a twist
    they never are before the end (importance sampling); with it, a particle stuck writing
    "a"s is replaced as soon as it sticks."""
    z = math.exp(run(enumerate_exact(Penalised(STICKY_LM, [1]))).log_ml)
    log_z = {
        name: np.array(
            [
                run(smc_standard(Penalised(STICKY_LM, [1], tw), 2, 1.0, seed=s)).log_ml
                for s in range(400)
            ]
        )
        for name, tw in (("none", None), ("learned", learned))
    }
    z_hat = np.exp(log_z["learned"])
    assert abs(z_hat.mean() - z) <= 4 * z_hat.std(ddof=1) / math.sqrt(len(z_hat))
    # variance of log Ẑ and the SE of each variance, measured from the runs
    sq = {k: (v - v.mean()) ** 2 for k, v in log_z.items()}
    var = {k: s.mean() for k, s in sq.items()}
    se = math.sqrt(sum(s.var(ddof=1) / len(s) for s in sq.values()))
    assert var["none"] - var["learned"] > 4 * se, (var, se)


# twelve short runs need not fit a head better than a constant (learn_twist says so); the test
# is about exactness, which holds for any twist
@pytest.mark.filterwarnings("ignore:learn_twist. the head is no better:UserWarning")
def test_a_learned_twist_in_hard_constraint_with_a_plain_callable_is_exact():
    features = TwistFeatures(constraint_signals(), progress(), repetition(), last_token(len(VOCAB)))
    twist = learn_twist(
        lambda lm, prompt, tw: _program(tw, "lazy", prompt),
        LM,
        [(1,), (2,), (3,), (1, 2)],
        features,
        n_particles=4,
        runs_per_prompt=3,
        seed=1,
        progress=False,
    )
    assert twist.report.trajectories == 48
    target, z = _target()
    for guide in (twist, twist.sharpened(3.0)):
        exact = run(enumerate_exact(_program(guide, "lazy")))
        paths = weighted_paths(exact)
        assert math.exp(exact.log_ml) == pytest.approx(z, abs=1e-9)
        for path, w in target.items():
            assert paths[path] / sum(paths.values()) == pytest.approx(w, abs=1e-9)
    with pytest.raises(ValueError, match="sharpness must be"):
        twist.sharpened(0)
    levels = [run(twist(_program(None, "lazy", p))) for p in [(0,), (0, 1, 2)]]
    assert all(-twist.clip <= lv <= 0.0 for lv in levels)


# ---------------------------------------------------------------- files and bad input
def test_save_and_load_give_the_same_twist(tmp_path, learned):
    path = tmp_path / "twist.pt"
    learned.save(path)
    with pytest.raises(ValueError, match="user's function"):
        LearnedTwist.load(path)
    again = LearnedTwist.load(path, features=_reward_features())
    model = Penalised(STICKY_LM, [0, 0, 1])
    assert run(again(model)) == run(learned(model))
    assert again.report.rollouts == learned.report.rollouts
    ready = LearnedTwist(
        TwistFeatures(progress(5), repetition()), *fit_head(torch.rand(20, 6), torch.rand(20) > 0.5)
    )
    ready.save(path)
    assert LearnedTwist.load(path).features.names == ("progress", "repetition")


def test_bad_twists_and_features_are_named():
    with pytest.raises(TypeError, match="twist must be a callable"):
        _program("guide")
    with pytest.raises(ValueError, match="finite log ψ"):
        run(smc_standard(_program(lambda m: math.nan), 2, seed=0))
    with pytest.raises(TypeError, match="next_token_hidden"):
        from llamppl.inference.twist_features import hidden_state

        run(hidden_state()(_program(None)))
    with pytest.raises(TypeError, match="must be a Feature"):
        TwistFeatures(lambda m: 0.0)
    with pytest.raises(ValueError, match="target must be one of"):
        learn_twist(Penalised, STICKY_LM, [[0]], _reward_features(), target="reward")
    with pytest.raises(ValueError, match="ess_threshold=0"):
        learn_twist(Penalised, STICKY_LM, [[0]], _reward_features(), target="weight")
    bad = Feature("bad", lambda m: _const(math.inf))
    with pytest.raises(ValueError, match="non-finite"):
        run(TwistFeatures(bad)(_program(None)))


async def _const(x):
    return torch.tensor([x])


# ---------------------------------------------------------------- the LM's hidden state
@pytest.mark.slow
def test_the_hidden_state_is_the_heads_input_and_costs_no_second_forward(make_lm):
    lm = make_lm()
    ids = lm.encode("The capital of France is")
    logps = run(lm.next_token_logprobs(ids))
    forwards = lm.stats.forward_calls
    hidden = run(lm.next_token_hidden(ids))
    assert lm.stats.forward_calls == forwards  # read from the trie node, no second pass
    assert hidden.shape == (lm.hidden_size,) and hidden.dtype == torch.float32
    with torch.inference_mode():  # the head on it gives the log-probs (to the head's rounding:
        again = lm._logprobs_from_hidden(hidden[None])[0]  # one row, not the forward's batch)
    assert (again - logps).abs().max() < 2e-2
    assert torch.equal(again.topk(5).indices, logps.topk(5).indices)
    longer = ids + lm.encode(" Paris")
    run(lm.next_token_hidden(longer))  # a new context: one forward, its log-probs cached
    assert lm.stats.forward_calls == forwards + 1
    run(lm.next_token_logprobs(longer))
    assert lm.stats.forward_calls == forwards + 1
