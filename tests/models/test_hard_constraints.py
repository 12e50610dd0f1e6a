"""HardConstraint and the constraint objects, against brute-force sums and the exact oracle."""

import itertools
import math

import numpy as np
import pytest
import torch

from llamppl import FunctionLM, run
from llamppl.constraints import banned_words, max_word_length, regex_prefix
from llamppl.decoding.constraints.protocol import AllOf, Constraint, PredicateConstraint
from llamppl.decoding.text.characters import MaxWordLength
from llamppl.inference import enumerate_exact, smc_standard, smc_steer
from llamppl.models import HardConstraint

VOCAB = ["a", "A", "bc", " ", "!", "b a ", "<eos>"]
EOS = 6
PROMPT = [0]
MAX_TOKENS = 3


def _logits(ctx):
    n, last = len(ctx), ctx[-1]
    return [math.sin(1.7 * i + 0.9 * n + 0.3 * last) for i in range(EOS)] + [-1.2 + 0.5 * n]


@pytest.fixture(scope="module")
def lm():
    return FunctionLM(VOCAB, EOS, _logits)


CONSTRAINTS = {
    "max_word_length": lambda: max_word_length(2),
    "banned_words": lambda: banned_words(["a", "bcb"]),
    "banned_case_sensitive": lambda: banned_words(["A"], case_sensitive=True),
    "regex": lambda: regex_prefix(r"(a|bc| )*!"),
    "callable": lambda: lambda text: text.count(" ") <= 1,
    "all_of": lambda: max_word_length(3) & banned_words(["bca"]),
}


def _texts(max_len):
    """Text of every sequence of at most ``max_len`` non-EOS tokens."""
    for k in range(max_len + 1):
        for seq in itertools.product(range(EOS), repeat=k):
            yield "".join(VOCAB[i] for i in seq)


def _as_obj(c):
    return c if isinstance(c, Constraint) else PredicateConstraint(c)


# ---------------------------------------------------------------------- constraint objects
@pytest.mark.parametrize("name", CONSTRAINTS)
def test_mask_equals_predicate_token_by_token(lm, name):
    c = _as_obj(CONSTRAINTS[name]())
    for text in set(_texts(3)):
        mask = c.allowed_mask(lm, text)
        assert mask.shape == (len(VOCAB),) and mask.dtype == torch.bool
        expected = [c(text + v) for v in VOCAB]
        expected[EOS] = c(text) and c.accepts_end(text)
        assert mask.tolist() == expected, text


def test_ready_made_predicates_meaning():
    c = max_word_length(5)
    assert c("The Fed says hello, world") and not c("The Fed sayss tomorrow")
    assert c("1234567 ab-cd") and not c("abcdef1")
    b = banned_words(["the"])
    assert b("the") and not b.accepts_end("the")  # may still become "then"
    assert b("then") and b.accepts_end("then") and not b("The ") and not b("a the!")
    r = regex_prefix(r"[0-9]+\.")
    assert r("") and r("12") and not r.accepts_end("12") and r.accepts_end("12.") and not r("1a")
    both = max_word_length(3) & banned_words(["cat"])
    assert isinstance(both, AllOf) and not both("cat ") and not both("abcd") and both("dog ")


# ---------------------------------------------------------------------- exact posterior
def _brute_force(lm, c, truncated="check"):
    """Posterior and Z of the LM cut at MAX_TOKENS tokens, conditioned on every prefix in C;
    a cut text is kept iff ``truncated`` says so (check: the complete check; keep: always;
    drop: never)."""
    c = _as_obj(c)
    weights = {}
    for k in range(MAX_TOKENS + 1):
        for body in itertools.product(range(EOS), repeat=k):
            ends = [body + (EOS,)] if k < MAX_TOKENS else [body]
            for seq in ends:
                texts = ["".join(VOCAB[i] for i in body[:t]) for t in range(1, k + 1)]
                ok = all(c(t) for t in texts)
                last = texts[-1] if texts else ""
                if seq[-1:] == (EOS,):
                    ok = ok and c.accepts_end(last)
                elif truncated == "check":
                    ok = ok and c.accepts_end(last)
                elif truncated == "drop":
                    ok = False
                if ok:
                    key = lm.decode(list(body))  # the text: posterior keys show no end token
                    p = math.exp(lm.sequence_logprob(PROMPT, seq))
                    weights[key] = weights.get(key, 0.0) + p
    z = sum(weights.values())
    return {k: w / z for k, w in weights.items()}, z


@pytest.mark.parametrize("truncated", ["check", "keep", "drop"])
@pytest.mark.parametrize("name", CONSTRAINTS)
def test_every_formulation_gives_the_conditioned_lm(lm, name, truncated):
    target, z = _brute_force(lm, CONSTRAINTS[name](), truncated)
    assert 0 < z < 1
    for proposal in ("sample", "mask", "lazy"):
        model = HardConstraint(
            lm,
            PROMPT,
            CONSTRAINTS[name](),
            proposal=proposal,
            max_tokens=MAX_TOKENS,
            truncated=truncated,
        )
        exact = run(enumerate_exact(model))
        assert exact.log_ml == pytest.approx(math.log(z), abs=1e-10), proposal
        assert exact.posterior.keys() == target.keys()
        for key, w in target.items():
            assert exact.posterior[key] == pytest.approx(w, abs=1e-10)


def test_mask_potential_is_allowed_mass(lm):
    """One step of the mask formulation: weight = log Σ_w p(w) 1_C(s w) (paper's G'_t)."""
    c = max_word_length(1)
    model = HardConstraint(lm, PROMPT, c, proposal="mask", max_tokens=MAX_TOKENS, end_twist=0)
    run(model.advance())
    p = torch.exp(lm.logprobs(PROMPT))
    allowed = [i for i, v in enumerate(VOCAB) if (c(v) if i != EOS else True)]
    assert model.weight == pytest.approx(math.log(float(p[allowed].sum())), abs=1e-12)
    assert int(model.context.tokens[-1]) in allowed


# ---------------------------------------------------------------------- unbiased Z under SMC
ALGORITHMS = {
    "smc_steer": lambda m, seed: smc_steer(m, 2, 2, seed=seed),
    "smc_standard": lambda m, seed: smc_standard(m, 3, seed=seed),
}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("proposal", ["sample", "mask", "lazy"])
@pytest.mark.parametrize("name", ["max_word_length", "banned_words", "callable"])
def test_z_hat_unbiased(lm, name, proposal, algorithm):
    _, z = _brute_force(lm, CONSTRAINTS[name]())
    c = CONSTRAINTS[name]()
    runs = 200
    z_hats = np.array(
        [
            math.exp(r.log_ml)
            if (
                r := run(
                    ALGORITHMS[algorithm](HardConstraint(lm, PROMPT, c, proposal, MAX_TOKENS), s)
                )
            ).log_ml
            > -math.inf
            else 0.0
            for s in range(runs)
        ]
    )
    se = z_hats.std(ddof=1) / math.sqrt(runs)
    assert se > 0
    assert abs(z_hats.mean() - z) <= 4 * se, (z_hats.mean(), z, se)


# ---------------------------------------------------------------------- bad input
def test_bad_input(lm):
    with pytest.raises(TypeError, match="predicate must be callable"):
        HardConstraint(lm, PROMPT, "no long words")
    with pytest.raises(ValueError, match="proposal must be one of"):
        HardConstraint(lm, PROMPT, max_word_length(2), proposal="greedy")
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        HardConstraint(lm, PROMPT, max_word_length(2), max_tokens=0)
    with pytest.raises(ValueError, match="predicate\\(''\\) is False"):
        HardConstraint(lm, PROMPT, lambda t: len(t) > 0)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        max_word_length(0)
    with pytest.raises(ValueError, match="words must contain at least one"):
        banned_words([])
    with pytest.raises(ValueError, match="words must be non-empty strings of letters"):
        banned_words(["two words"])
    with pytest.raises(TypeError, match="words must be an iterable"):
        banned_words("word")
    with pytest.raises(ValueError, match="pattern is not a valid regular expression"):
        regex_prefix("(unclosed")
    with pytest.raises(TypeError, match="other must be callable"):
        max_word_length(2) & 3


# ---------------------------------------------------------------------- embedded model
@pytest.mark.slow
@pytest.mark.parametrize(
    "constraint",
    [max_word_length(5), banned_words(["the", "rates"]), regex_prefix(r"[^0-9]* [a-z]+")],
    ids=repr,
)
def test_vectorised_mask_equals_per_token_check_on_real_vocab(smollm, constraint):
    """The vectorised mask and the default (listed on the vocabulary's trie, which relies on
    the check being closed under prefixes) both equal one check per token."""
    eos = list(smollm.eos_token_ids)
    for text in ["", " it will", " The Fed's mortg", " rates rise"]:
        scan = torch.tensor([constraint(text + t) for t in smollm.vocab])
        scan[eos] = constraint.accepts_end(text)
        fast = constraint.allowed_mask(smollm, text)
        listed = Constraint.allowed_mask(constraint, smollm, text)
        assert fast.device == smollm.device and torch.equal(fast.cpu(), scan), text
        assert torch.equal(listed.cpu(), scan), text


class _CountingMaxWordLength(MaxWordLength):
    calls = 0

    def __call__(self, text):
        type(self).calls += 1
        return super().__call__(text)


@pytest.mark.slow
@pytest.mark.parametrize("proposal", ["mask", "sample"])
def test_real_lm_samples_satisfy_max_word_length(smollm, proposal):
    c = _CountingMaxWordLength(5)
    _CountingMaxWordLength.calls = 0
    result = run(
        smc_steer(
            HardConstraint(smollm, "The Fed says", c, proposal=proposal, max_tokens=8), 3, 2, seed=0
        )
    )
    steps = len(result.history)
    assert result.log_ml > -math.inf or proposal == "sample"
    for p, w in zip(result.particles, result.log_weights):
        if w > -math.inf:
            assert c(p.text) and max_word_length(5)(str(p.context)), p.text
    # work count: the predicate is called a few times per particle per step, never once per token
    assert _CountingMaxWordLength.calls <= 4 * 6 * steps + 1


@pytest.mark.parametrize("truncated", ["check", "drop"])
def test_each_text_says_how_it_ended(lm, truncated):
    """``ending``: "end token" for an end token drawn among others, "forced end" for one at the
    last position under "drop" (only end tokens allowed there), "cut" for a text cut at the
    limit; the run record stores it and the display marks forced ends."""
    seen = set()
    for proposal in ("sample", "mask", "lazy"):
        model = HardConstraint(
            lm, PROMPT, max_word_length(2), proposal=proposal, max_tokens=MAX_TOKENS,
            truncated=truncated,
        )  # fmt: skip
        exact = run(enumerate_exact(model))
        for p, w in zip(exact.particles, exact.weights):
            if w == 0:
                continue
            generated = p.context.generated
            if generated[-1] != EOS:
                expected = "cut"
            elif len(generated) == MAX_TOKENS and truncated == "drop":
                expected = "forced end"
            else:
                expected = "end token"
            assert p.ending == expected, (proposal, p.text, generated)
            seen.add(expected)
    assert seen == ({"end token", "forced end"} if truncated == "drop" else {"end token", "cut"})
    if truncated == "drop":
        result = run(smc_standard(model, 64, 0.5, seed=0, record=True))
        finals = [e.get("ending") for e in result.record["final"] if e["finished"]]
        assert set(finals) == {p.ending for p in result.particles} >= {"forced end"}
        assert "(forced end)" in repr(result) and "note: (forced end)" in repr(result)
