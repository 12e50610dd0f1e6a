"""PromptIntersection: both Feynman–Kac models against a brute-force product of experts."""

import itertools
import math

import numpy as np
import pytest

from llamppl import FunctionLM, run
from llamppl.inference import enumerate_exact, smc_standard, smc_steer
from llamppl.models import PromptIntersection

VOCAB = ["a", "b", "c", ".", "<eos>"]
EOS = 4
MAX_TOKENS = 3


def _logits(ctx):
    """Prompt-dependent: the first prompt token shifts every later distribution."""
    n, first, last = len(ctx), ctx[0], ctx[-1]
    out = [math.sin(1.1 * i + 0.8 * first + 0.5 * n + 0.3 * last) for i in range(EOS)]
    out[2] = (
        -math.inf if first == 2 and n > 2 else out[2]
    )  # prompt [2, ...] never continues with "c"
    return out + [-1.0 + 0.4 * n]


@pytest.fixture(scope="module")
def lm():
    return FunctionLM(VOCAB, EOS, _logits)


PROMPT_SETS = {
    "two": [[0], [1, 3]],
    "three": [[0], [1, 3], [2, 0]],
}


def _brute_force(lm, prompts, stop=(EOS,)):
    """P(s) ∝ ∏_i P_{x_i}(s) over stopped strings of <= MAX_TOKENS tokens and truncated ones."""
    weights = {}
    for k in range(1, MAX_TOKENS + 1):
        for seq in itertools.product(range(len(VOCAB)), repeat=k):
            stops = [t in stop for t in seq]
            if any(stops[:-1]) or (k < MAX_TOKENS and not stops[-1]):
                continue  # stopped early, or neither stopped nor truncated
            w = math.exp(sum(lm.sequence_logprob(p, seq) for p in prompts))
            if w > 0:  # the key is the text: an end token is not shown (stop strings are)
                key = lm.decode([t for t in seq if t != EOS])
                weights[key] = weights.get(key, 0.0) + w
    z = sum(weights.values())
    return {k: v / z for k, v in weights.items()}, z


@pytest.mark.parametrize("prompts", PROMPT_SETS)
def test_both_proposals_give_the_product_of_experts(lm, prompts):
    target, z = _brute_force(lm, PROMPT_SETS[prompts])
    for proposal in ("first", "product"):
        model = PromptIntersection(
            lm, PROMPT_SETS[prompts], proposal=proposal, max_tokens=MAX_TOKENS
        )
        exact = run(enumerate_exact(model))
        assert exact.log_ml == pytest.approx(math.log(z), abs=1e-10)
        assert exact.posterior.keys() == target.keys()
        for key, w in target.items():
            assert exact.posterior[key] == pytest.approx(w, abs=1e-10)


class _StopAtPeriod(PromptIntersection):
    def is_stop_token(self, token):
        return token in (3, EOS)


@pytest.mark.parametrize("how", ["stop_strings", "subclass"])
def test_stop_tokens(lm, how):
    prompts = PROMPT_SETS["two"]
    target, z = _brute_force(lm, prompts, stop=(3, EOS))
    if how == "subclass":
        model = _StopAtPeriod(lm, prompts, max_tokens=MAX_TOKENS)
    else:
        model = PromptIntersection(lm, prompts, max_tokens=MAX_TOKENS, stop_strings=["."])
    exact = run(enumerate_exact(model))
    assert exact.log_ml == pytest.approx(math.log(z), abs=1e-10)
    assert exact.posterior == pytest.approx(target, abs=1e-10)


def test_product_step_weight_is_normaliser(lm):
    """One product step scores G'_t = Σ_w ∏_i p_i(w) (paper §2.2)."""
    prompts = PROMPT_SETS["three"]
    model = PromptIntersection(lm, prompts, proposal="product")
    run(model.advance())
    joint = sum(lm.logprobs(p) for p in prompts)
    assert model.weight == pytest.approx(float(np.logaddexp.reduce(joint.numpy())), abs=1e-12)
    assert len({tuple(c.generated) for c in model.contexts}) == 1


ALGORITHMS = {
    "smc_steer": lambda m, seed: smc_steer(m, 2, 2, seed=seed),
    "smc_standard": lambda m, seed: smc_standard(m, 3, seed=seed),
}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("proposal", ["first", "product"])
def test_z_hat_unbiased(lm, proposal, algorithm):
    prompts = PROMPT_SETS["two"]
    _, z = _brute_force(lm, prompts)
    runs = 200
    z_hats = np.array(
        [
            math.exp(
                run(
                    ALGORITHMS[algorithm](PromptIntersection(lm, prompts, proposal, MAX_TOKENS), s)
                ).log_ml
            )
            for s in range(runs)
        ]
    )
    se = z_hats.std(ddof=1) / math.sqrt(runs)
    assert se > 0
    assert abs(z_hats.mean() - z) <= 4 * se, (z_hats.mean(), z, se)


def test_bad_input(lm):
    with pytest.raises(ValueError, match="prompts must hold at least two prompts"):
        PromptIntersection(lm, [[0]])
    with pytest.raises(ValueError, match="prompts must hold at least two prompts"):
        PromptIntersection(lm, [])
    with pytest.raises(TypeError, match="prompts must be a list"):
        PromptIntersection(lm, "a")
    with pytest.raises(ValueError, match="proposal must be one of"):
        PromptIntersection(lm, [[0], [1]], proposal="mixture")
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        PromptIntersection(lm, [[0], [1]], max_tokens=0)
    with pytest.raises(TypeError, match="stop_strings must be a sequence of non-empty strings"):
        PromptIntersection(lm, [[0], [1]], stop_strings=".")


@pytest.mark.slow
@pytest.mark.parametrize("proposal", ["first", "product"])
def test_real_lm_one_forward_per_step(smollm, proposal):
    prompts = ["My favorite writer is probably", "My favorite physicist is probably"]
    before = smollm.stats.forward_calls
    result = run(
        smc_steer(PromptIntersection(smollm, prompts, proposal, max_tokens=3), 2, 2, seed=0)
    )
    assert result.log_ml > -math.inf
    assert smollm.stats.forward_calls - before <= len(result.history)  # all prompts in one batch
    for p in result.particles:
        assert p.contexts[0].generated == p.contexts[1].generated
