"""Infilling against brute-force sums over holes and strings, closed forms, and the exact oracle."""

import itertools
import math

import numpy as np
import pytest

from llamppl import FunctionLM, run
from llamppl.inference import enumerate_exact, smc_standard, smc_steer
from llamppl.models import Infilling
from llamppl.models.infilling import TruncatedGeometric, split_template

VOCAB = ["x", "y", "a", "b", ".", "<eos>"]
EOS = 5
HOLE_TOKENS = [0, 1, 2, 3, 4]  # every token but EOS


def _logits(ctx):
    n, last = len(ctx), ctx[-1]
    return [math.cos(1.3 * i + 0.7 * n + 0.4 * last) for i in range(EOS)] + [-0.8 + 0.3 * n]


def _unique_logits(ctx):
    """Like _logits, but "y" and "." occur at most once: every string has one decomposition."""
    out = _logits(ctx)
    for tok in (1, 4):
        if tok in ctx:
            out[tok] = -math.inf
    return out


@pytest.fixture(scope="module")
def lm():
    return FunctionLM(VOCAB, EOS, _logits)


def _truncated_geometric(q, max_k):
    w = [(1 - q) ** k * q for k in range(max_k + 1)]
    return [v / sum(w) for v in w]


def _holes(max_k):
    for k in range(max_k + 1):
        yield from itertools.product(HOLE_TOKENS, repeat=k)


def _brute_force(lm, fragments, q, correction, max_k, eos):
    """Sum over every hole tuple of p(h_1 x_1 ... h_n x_n [EOS] | x_0) (× ∏ P(|h|) without correction)."""
    prompt = lm.encode(fragments[0])
    frags = [lm.encode(f) for f in fragments[1:]]
    prior = _truncated_geometric(q, max_k)
    weights = {}
    for holes in itertools.product(list(_holes(max_k)), repeat=len(frags)):
        seq = [t for h, f in zip(holes, frags) for t in (*h, *f)] + ([EOS] if eos else [])
        w = math.exp(lm.sequence_logprob(prompt, seq))
        if not correction:
            w *= math.prod(prior[len(h)] for h in holes)
        key = fragments[0] + lm.decode(seq[:-1] if eos else seq)
        weights[key] = weights.get(key, 0.0) + w
    z = sum(weights.values())
    return {k: v / z for k, v in weights.items()}, z


@pytest.mark.parametrize(
    "fragments, max_k, q, correction, eos",
    [
        (["x", "y", "."], 1, 0.5, True, True),
        (["x", "y", "."], 1, 0.5, False, True),
        (["x", "y", "."], 1, 0.3, True, False),
        (["x", "y", "."], 1, 0.3, False, False),
        (["x", "ya"], 3, 0.5, True, True),
        (["x", ""], 3, 0.4, False, True),
    ],
)
def test_exact_posterior_matches_brute_force_over_holes(lm, fragments, max_k, q, correction, eos):
    target, z = _brute_force(lm, fragments, q, correction, max_k, eos)
    model = Infilling(
        lm, fragments, geometric_p=q, length_correction=correction, max_hole_tokens=max_k, eos=eos
    )
    exact = run(enumerate_exact(model))
    assert exact.log_ml == pytest.approx(math.log(z), abs=1e-10)
    assert exact.posterior.keys() == target.keys()
    for key, w in target.items():
        assert exact.posterior[key] == pytest.approx(w, abs=1e-10)


def test_posterior_is_lm_conditioned_on_template_when_decomposition_is_unique():
    """Independent sum over *strings*: P(s) ∝ p(s | x_0) 1[s = x_0 h_1 y h_2 . EOS, |h_i| <= 2]."""
    lm = FunctionLM(VOCAB, EOS, _unique_logits)
    weights = {}
    for n in range(3, 8):
        for seq in itertools.product(range(EOS + 1), repeat=n):
            if seq[-1] != EOS or EOS in seq[:-1]:
                continue
            body = seq[:-1]
            if not any(
                len(body) == k1 + k2 + 2 and body[k1] == 1 and body[-1] == 4
                for k1 in range(3)
                for k2 in range(3)
            ):
                continue
            w = math.exp(lm.sequence_logprob([0], seq))
            if w > 0:
                weights["x" + lm.decode(list(body))] = w
    z = sum(weights.values())
    exact = run(enumerate_exact(Infilling(lm, ["x", "y", "."], max_hole_tokens=2)))
    assert exact.log_ml == pytest.approx(math.log(z), abs=1e-10)
    assert exact.posterior.keys() == weights.keys()
    for key, w in weights.items():
        assert exact.posterior[key] == pytest.approx(w / z, abs=1e-10)


def test_step_weight_is_papers_potential(lm):
    """q = 1/2: G_t = 2^{|h|+1} ∏ (1 - p(EOS)) over hole tokens ∏ p(fragment tokens)."""
    from llamppl import using_rng

    for seed in range(10):
        model = Infilling(lm, ["x", "y"], eos=False)
        with using_rng(np.random.default_rng(seed)):
            run(model.advance())
        tokens = model.context.tokens
        hole = tokens[1:-1]
        expected = (len(hole) + 1) * math.log(2)
        for i in range(len(hole)):
            expected += math.log1p(-math.exp(float(lm.logprobs(tokens[: 1 + i])[EOS])))
        expected += float(lm.logprobs(tokens[:-1])[1])
        assert tokens[-1] == 1 and EOS not in hole
        assert model.weight == pytest.approx(expected, abs=1e-12)
        assert model.finished and model.holes == [lm.decode(hole)]


# ---------------------------------------------------------------------- unbiased Z
def _z_hats(make_model, algorithm, runs=200):
    return np.array(
        [
            math.exp(lm_) if (lm_ := run(algorithm(make_model(), s)).log_ml) > -math.inf else 0.0
            for s in range(runs)
        ]
    )


ALGORITHMS = {
    "smc_steer": lambda m, seed: smc_steer(m, 2, 2, seed=seed),
    "smc_standard": lambda m, seed: smc_standard(m, 3, seed=seed),
}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_z_hat_unbiased_truncated(lm, algorithm):
    _, z = _brute_force(lm, ["x", "y", "."], 0.5, True, 2, True)
    z_hats = _z_hats(
        lambda: Infilling(lm, ["x", "y", "."], max_hole_tokens=2), ALGORITHMS[algorithm]
    )
    se = z_hats.std(ddof=1) / math.sqrt(len(z_hats))
    assert abs(z_hats.mean() - z) <= 4 * se, (z_hats.mean(), z, se)


IID_LOGITS = [0.3, -0.2, 0.5, 0.0, -0.4, 1.5]  # context-free LM: closed-form Z with unbounded holes


@pytest.mark.parametrize("correction", [True, False])
def test_z_hat_unbiased_unbounded_geometric(correction):
    """i.i.d. tokens with probabilities r: Z = Σ_k c_k (1 - r_EOS)^k per hole, in closed form.

    r_EOS = 0.45, so the weights 2^{k+1} (1 - r_EOS)^k have finite variance (needs (1 - r_EOS)^2 < 1/2).

    With the correction c_k = 1, so each hole gives 1 / r_EOS; without it c_k = P(k) = (1-q)^k q,
    giving q / (1 - (1-q)(1 - r_EOS)). Fragments "y" and "." and the final EOS add r_y r_. r_EOS.
    """
    lm = FunctionLM(VOCAB, EOS, lambda ctx: IID_LOGITS)
    r = np.exp(IID_LOGITS) / np.exp(IID_LOGITS).sum()
    q, r_eos = 0.5, r[EOS]
    per_hole = 1 / r_eos if correction else q / (1 - (1 - q) * (1 - r_eos))
    z = per_hole**2 * r[1] * r[4] * r_eos
    z_hats = _z_hats(
        lambda: Infilling(lm, ["x", "y", "."], length_correction=correction),
        ALGORITHMS["smc_standard"],
    )
    se = z_hats.std(ddof=1) / math.sqrt(len(z_hats))
    assert abs(z_hats.mean() - z) <= 4 * se, (z_hats.mean(), z, se)


# ---------------------------------------------------------------------- pieces and bad input
def test_truncated_geometric_and_template():
    d = TruncatedGeometric(0.3, 4)
    support = run(d.support())
    assert [k for k, _ in support] == [0, 1, 2, 3, 4]
    assert np.exp([lp for _, lp in support]) == pytest.approx(
        _truncated_geometric(0.3, 4), abs=1e-14
    )
    assert run(d.log_prob(5)) == -math.inf
    assert split_template("a[BLANK]b[BLANK]") == ["a", "b", ""]


def test_bad_input(lm):
    with pytest.raises(ValueError, match="fragments must hold at least two"):
        Infilling(lm, [])
    with pytest.raises(ValueError, match="fragments must hold at least two"):
        Infilling(lm, ["x"])
    with pytest.raises(TypeError, match="fragments must be a list"):
        Infilling(lm, "x y")
    with pytest.raises(TypeError, match=r"fragments\[1\] must be a str"):
        Infilling(lm, ["x", 3])
    with pytest.raises(ValueError, match="template must contain at least one \\[BLANK\\]"):
        Infilling.from_template(lm, "no holes here")
    with pytest.raises(ValueError, match="geometric_p must lie in"):
        Infilling(lm, ["x", "y"], geometric_p=0.0)
    with pytest.raises(ValueError, match="max_hole_tokens must be a non-negative integer"):
        Infilling(lm, ["x", "y"], max_hole_tokens=-1)


# ---------------------------------------------------------------------- embedded model
@pytest.mark.slow
def test_real_lm_samples_contain_fragments_in_order(smollm):
    template = "To tell the truth, every[BLANK] he[BLANK] to[BLANK] another[BLANK]."
    fragments = split_template(template)
    model = Infilling.from_template(smollm, template, max_hole_tokens=2)
    result = run(smc_steer(model, 2, 2, seed=0))
    assert result.log_ml > -math.inf
    for p in result.particles:
        text = str(p)
        assert text.startswith(fragments[0]) and text.endswith(fragments[-1])
        pos = 0
        for f in fragments:
            pos = text.index(f, pos) + len(f)
        assert len(p.holes) == len(fragments) - 1
        assert text == fragments[0] + "".join(h + f for h, f in zip(p.holes, fragments[1:]))
