"""SPECS and reward-guided beam search against brute force on small FunctionLMs (and work counts on SmolLM2)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from llamppl import FunctionLM, run
from llamppl.models import beam_search, specs

NEG = -math.inf
VOCAB = ["a", "b", ".", "x"]
PROMPT = [0]
TAIL = 2  # answer tokens after the forced prefix


def _toy(first: list[float], after_a: list[float], forced: int) -> FunctionLM:
    """After the prompt "a": ``forced`` tokens "x", then a tail ".", "a.", "aa" (cut off) or "b."."""

    def logits(ctx: tuple[int, ...]) -> list[float]:
        gen = ctx[1:]
        if len(gen) < forced:
            return [NEG, NEG, NEG, 0.0]
        tail = gen[forced:]
        if not tail:
            return first + [NEG]
        return (after_a if tail[0] == 0 else [NEG, NEG, 0.0]) + [NEG]

    return FunctionLM(VOCAB, 2, logits)


def target_lm(forced: int = 0) -> FunctionLM:
    return _toy([0.2, -0.3, -0.5], [0.4, NEG, 0.0], forced)


def draft_lm(forced: int = 0) -> FunctionLM:  # same support as the target, other probabilities
    return _toy([-0.4, 0.5, 0.1], [-0.2, NEG, 0.3], forced)


TARGET, DRAFT = target_lm(), draft_lm()
REWARDS = {"": 0.0, "a": 0.5, "aa": -0.3, "b": 1.0}  # on the answer's tail text (EOS excluded)
BETA = 2.0


def full_text_reward(prompt_text: str, text: str) -> float:
    assert prompt_text == "a"
    return REWARDS[text.lstrip("x")]


def outcomes(lm: FunctionLM) -> dict[tuple[int, ...], float]:
    """Every tail of at most TAIL tokens (EOS-terminated or cut off) with its probability, by brute force."""
    out = {}
    for length in range(1, TAIL + 1):
        for seq in itertools.product(range(len(VOCAB)), repeat=length):
            if 2 in seq[:-1] or (length < TAIL and seq[-1] != 2):
                continue
            p = math.exp(lm.sequence_logprob(PROMPT, seq))
            if p > 0:
                out[seq] = p
    assert sum(out.values()) == pytest.approx(1.0, abs=1e-12)
    return out


def text_of(seq: tuple[int, ...]) -> str:
    return TARGET.decode([t for t in seq if t != 2])


def tilted_target() -> dict[str, float]:
    """π*_β(y) ∝ π_target(y) e^{β r(y)} (SPECS eq. 3), by brute force."""
    w = {text_of(y): p * math.exp(BETA * REWARDS[text_of(y)]) for y, p in outcomes(TARGET).items()}
    z = sum(w.values())
    return {k: v / z for k, v in w.items()}


def snis_law(gen: FunctionLM, n: int) -> dict[str, float]:
    """Exact law of SUBSAMPLE's output for one block: Σ_c Mult(c; n, q) · c_y w_y / Σ_j c_j w_j.

    q = π_gen over the K answers, w_y = π_target(y)/π_gen(y) · e^{β r(y)}; c runs over all
    count vectors of n draws (stars and bars).
    """
    q_map, p_map = outcomes(gen), outcomes(TARGET)
    keys = sorted(q_map)
    q = np.array([q_map[k] for k in keys])
    w = np.array([p_map[k] / q_map[k] * math.exp(BETA * REWARDS[text_of(k)]) for k in keys])
    k = len(keys)
    bars = np.array(list(itertools.combinations(range(n + k - 1), k - 1)))  # (C, K-1)
    edges = np.concatenate(
        [np.full((len(bars), 1), -1), bars, np.full((len(bars), 1), n + k - 1)], 1
    )
    counts = np.diff(edges, axis=1) - 1  # (C, K), rows sum to n
    assert (counts.sum(1) == n).all()
    log_mult = (
        math.lgamma(n + 1)
        - np.vectorize(math.lgamma)(counts + 1).sum(1)
        + (counts * np.log(q)).sum(1)
    )
    share = counts * w / (counts * w).sum(1, keepdims=True)  # (C, K)
    law = (np.exp(log_mult)[:, None] * share).sum(0)
    return {text_of(key): float(v) for key, v in zip(keys, law)}


def total_variation(p, q):
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


# ---------------------------------------------------------------------------- theory
@pytest.mark.parametrize("gen", ["target", "draft"])
def test_exact_subsample_law_converges_to_tilted_target(gen):
    """One block = SNIS (eq. 4): its exact output law approaches π*_β as n grows (Theorem 3)."""
    lm = TARGET if gen == "target" else DRAFT
    pi = tilted_target()
    tvs = [total_variation(snis_law(lm, n), pi) for n in (1, 4, 16, 64)]
    assert all(a > b for a, b in itertools.pairwise(tvs)), tvs
    assert tvs[-1] < 0.05, tvs
    assert tvs[0] > 0.1  # n = 1 is just π_gen: far from π*_β, so the check has teeth


RUNS = 400  # the exact law is the oracle; the runs check that specs() realises it


@pytest.mark.parametrize("forced", [0, 2], ids=["one-target-block", "target-then-draft-block"])
def test_specs_output_matches_exact_law(forced):
    """Seeded runs at n = 64: frequencies match the exact SNIS law (each within 4 binomial
    SEs of it), whose TV to π*_β is < 0.05 (test above).

    forced = 0: draft == target, one block covers the answer, the log ratio is 0.
    forced = 2: iteration 1 can only draw "xx" (reward 0 > τ = -1, so π_gen switches),
    iteration 2 drafts the whole tail from the draft: SNIS with w = π_t/π_d · e^{βr}.
    """
    n = 64
    target = target_lm(forced)
    draft = target if forced == 0 else draft_lm(forced)
    law = snis_law(TARGET if forced == 0 else DRAFT, n)
    counts: dict[str, int] = {}
    for s in range(RUNS):
        out = run(
            specs(target, draft, full_text_reward, PROMPT, n, max(forced, TAIL), BETA, -1.0,
                  forced + TAIL, seed=s)
        )  # fmt: skip
        if forced:
            assert [st.generator for st in out.steps] == ["target", "draft"]
            assert out.steps[0].switched and out.tokens[:forced] == [3] * forced
        else:
            assert len(out.steps) == 1 and out.steps[0].log_ratios == [0.0] * n
        counts[out.text.lstrip("x")] = counts.get(out.text.lstrip("x"), 0) + 1
    freq = {k: c / RUNS for k, c in counts.items()}
    for k, p in law.items():
        se = math.sqrt(p * (1 - p) / RUNS)
        assert abs(freq.get(k, 0.0) - p) <= 4 * se, (k, freq.get(k), p, se)
    assert total_variation(law, tilted_target()) < 0.05


# ---------------------------------------------------------------------------- switching
def _never_eos(bias: float) -> FunctionLM:
    return FunctionLM(VOCAB, 2, lambda ctx: [bias, 0.0, NEG, -0.5])


def test_switch_rule_is_algorithm_1_lines_9_10():
    """Switch once max_i r(Y_i|tr) > τ; Algorithm 1 never switches back, even when rewards drop."""
    target, draft = _never_eos(0.0), _never_eos(1.0)

    def reward(prompt_text: str, text: str) -> float:  # 0.1, 0.2, then 0 from the third token on
        return 0.1 * len(text) if len(text) <= 2 else 0.0

    out = run(specs(target, draft, reward, PROMPT, n=3, block=1, beta=1.0, tau=0.15,
                    max_tokens=5, seed=0))  # fmt: skip
    assert [s.generator for s in out.steps] == ["target", "target", "draft", "draft", "draft"]
    assert [s.switched for s in out.steps] == [False, True, False, False, False]
    assert [max(s.rewards) for s in out.steps] == pytest.approx([0.1, 0.2, 0.0, 0.0, 0.0])
    assert draft.batch_calls == 3 and out.draft_forwards == 3  # one call per drafted token
    assert target.batch_calls == 2 + 3 and out.target_forwards == 5  # 2 generated + 3 scorings
    prefix = list(PROMPT)
    for step in out.steps:  # eq. (1) with the exact log ratio of each candidate
        for y, lr, r, sc in zip(step.candidates, step.log_ratios, step.rewards, step.scores):
            if step.generator == "draft":
                exact = target.sequence_logprob(prefix, y) - draft.sequence_logprob(prefix, y)
                assert lr == pytest.approx(exact, abs=1e-12)
            else:
                assert lr == 0.0
            assert sc == pytest.approx(lr + 1.0 * r, abs=1e-12)
        prefix += step.candidates[step.chosen]
    assert out.tokens == prefix[len(PROMPT) :] and len(out.tokens) == 5


def test_high_tau_never_drafts(capsys):
    target, draft = _never_eos(0.0), _never_eos(1.0)
    out = run(
        specs(target, draft, lambda p, t: 1.0, PROMPT, 4, 2, 1.0, 1.0, 6, seed=1, progress=True)
    )
    bar = capsys.readouterr().err
    assert "specs" in bar and "3/3" in bar and "generator=target" in bar
    assert [s.generator for s in out.steps] == ["target"] * 3
    assert draft.batch_calls == 0 and out.draft_forwards == 0


def test_one_batched_call_per_token_position():
    """Every iteration: one coalesced call per token position of its longest candidate, and
    (when drafting) one target call to score all candidates' prefixes."""
    target = FunctionLM(VOCAB, 2, lambda ctx: [0.0, 0.0, -1.0, -0.5])
    draft = FunctionLM(VOCAB, 2, lambda ctx: [0.5, 0.0, -1.0, 0.0])
    out = run(specs(target, draft, lambda p, t: 0.0, PROMPT, n=8, block=3, beta=1.0, tau=-1.0,
                    max_tokens=7, seed=3))  # fmt: skip
    assert len(out.steps) >= 2
    for i, step in enumerate(out.steps):
        assert step.generation_forwards == max(map(len, step.candidates))
        assert step.scoring_forwards == (1 if i > 0 else 0)
    assert out.tokens_drawn == sum(len(c) for s in out.steps for c in s.candidates)
    assert out.target_forwards == target.batch_calls and out.draft_forwards == draft.batch_calls


def test_embedded_model_one_forward_per_token(make_lm):
    """n = 4, block = 4 on SmolLM2: drawing costs one forward per token position (all 4
    candidates together), scoring a drafted block on the target costs one forward."""
    target, draft = make_lm(), make_lm()  # same weights, separate caches and counters
    out = run(specs(target, draft, lambda p, t: float(len(t) > 0), "The capital of France is",
                    n=4, block=4, beta=1.0, tau=0.5, max_tokens=8, seed=0))  # fmt: skip
    assert [s.generator for s in out.steps] == ["target", "draft"]
    first, second = out.steps
    assert first.generation_forwards == max(map(len, first.candidates))
    assert second.generation_forwards == max(map(len, second.candidates))
    assert second.scoring_forwards == 1
    assert target.stats.forward_calls == out.target_forwards
    assert draft.stats.forward_calls == out.draft_forwards == second.generation_forwards
    assert max(abs(x) for x in second.log_ratios) < 1e-2  # same weights: ratio ≈ 1


# ---------------------------------------------------------------------------- API
def test_async_reward_and_seed_reproducibility():
    async def areward(prompt_text: str, text: str) -> float:
        return REWARDS[text]

    a = run(specs(TARGET, DRAFT, full_text_reward, PROMPT, 8, 1, BETA, 0.3, TAIL, seed=5))
    b = run(specs(TARGET, DRAFT, areward, PROMPT, 8, 1, BETA, 0.3, TAIL, seed=5))
    assert a.tokens == b.tokens and a.steps == b.steps
    assert a.reward == full_text_reward("a", a.text)
    assert a.text == text_of(tuple(a.tokens))


@pytest.mark.parametrize(
    "kw, err, name",
    [
        ({"n": 0}, ValueError, "n"),
        ({"n": True}, TypeError, "n"),
        ({"block": 0}, ValueError, "block"),
        ({"beta": math.inf}, ValueError, "beta"),
        ({"beta": math.nan}, ValueError, "beta"),
        ({"beta": -1.0}, ValueError, "beta"),
        ({"tau": math.nan}, ValueError, "tau"),
        ({"tau": -math.inf}, ValueError, "tau"),
        ({"max_tokens": 0}, ValueError, "max_tokens"),
        ({"reward": None}, TypeError, "reward"),
        ({"reward": lambda p, t: math.nan}, ValueError, "reward"),
        ({"draft": FunctionLM(["a", "b", ".", "y"], 2, lambda c: [0.0] * 4)}, ValueError, "draft"),
        ({"draft": FunctionLM(["a", "b", ".", "x"], 0, lambda c: [0.0] * 4)}, ValueError, "draft"),
        ({"draft": "gpt"}, TypeError, "draft"),
    ],
)
def test_bad_input(kw, err, name):
    args = {"target": TARGET, "draft": DRAFT, "reward": full_text_reward, "prompt": PROMPT}
    args.update(kw)
    with pytest.raises(err, match=name):
        run(specs(**args))


# ---------------------------------------------------------------------------- beam search
def test_beam_search_keeps_top_rewards(capsys):
    lm = _never_eos(0.0)
    reward = lambda p, t: t.count("a") - 0.5 * t.count("x")  # noqa: E731
    out = run(beam_search(lm, reward, PROMPT, beam_width=2, block=1, max_tokens=3, seed=0,
                          expansions=3, progress=True))  # fmt: skip
    bar = capsys.readouterr().err
    assert "beam_search" in bar and "3/3" in bar and "best=" in bar
    assert len(out.steps) == 3
    for step in out.steps:
        assert len(step.rewards) == 6  # two beams (two empty ones at first), expanded 3 times
        assert sorted(step.rewards, reverse=True)[:2] == [step.rewards[k] for k in step.kept]
        assert step.forwards == 1  # all beams' candidates in one batched call
    assert out.reward == max(out.steps[-1].rewards) == reward("a", out.text)
    assert len(out.tokens) == 3 and out.forwards == lm.batch_calls == 3


def test_beam_search_best_of_n_finds_the_best_answer():
    """beam_width 1, one block over the whole answer: best-of-64 by reward. All four answers
    are drawn (checked), so the output is the argmax "b"."""
    out = run(beam_search(TARGET, full_text_reward, PROMPT, 1, 8, TAIL, seed=0, expansions=64))
    assert len(out.steps) == 1 and set(out.steps[0].rewards) == set(REWARDS.values())
    assert out.text == "b" and out.tokens == [1, 2] and out.reward == 1.0


def test_beam_search_finished_beams_survive():
    """A finished beam with the top reward is carried over untouched (last in the pool,
    kept first) while the other beam grows to max_tokens."""
    lm = FunctionLM(VOCAB, 2, lambda ctx: [0.0, 0.0, -1.5, NEG])
    reward = lambda p, t: 10.0 if t == "" else len(t)  # noqa: E731  (immediate EOS is best)
    out = run(beam_search(lm, reward, PROMPT, 2, 1, 3, seed=0, expansions=4))
    assert len(out.steps[0].rewards) == 8  # two empty beams, 4 expansions each
    assert out.steps[0].rewards.count(10.0) == 1  # this seed draws exactly one immediate EOS
    assert [s.kept[0] for s in out.steps[1:]] == [4, 4]  # pool = 4 new candidates + the finished
    assert len(out.steps) == 3 and out.tokens == [2] and out.text == "" and out.reward == 10.0


@pytest.mark.parametrize(
    "kw, err, name",
    [
        ({"beam_width": 0}, ValueError, "beam_width"),
        ({"block": -1}, ValueError, "block"),
        ({"expansions": 0}, ValueError, "expansions"),
        ({"reward": 3}, TypeError, "reward"),
        ({"lm": None}, TypeError, "lm"),
    ],
)
def test_beam_search_bad_input(kw, err, name):
    args = {"lm": TARGET, "reward": full_text_reward, "prompt": PROMPT}
    args.update(kw)
    with pytest.raises(err, match=name):
        run(beam_search(**args))
