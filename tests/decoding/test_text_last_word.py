"""Positions from the end (``words_at({-1: w})``): an exact posterior, and a sound budget that
steers toward writing the word in time.

- ``enumerate_exact`` of ``HardConstraint`` equals a brute-force sum for every proposal, with
  and without plain characters, alone and next to a cap on the word count;
- along every token sequence the target accepts, ``need`` never exceeds the tokens the
  sequence still spends, ``reachable`` holds and ``budget_mask`` keeps its next token (the
  budget only ever leaves out dead ends);
- the budget steers: ``need`` counts the word's tokens until the text ends on it, and with no
  token to spare only tokens that write it are left.
"""

from __future__ import annotations

import itertools
import math

import pytest

pytest.importorskip("nltk")

from text_programs import LM, brute  # noqa: E402

from llamppl import FunctionLM, run  # noqa: E402
from llamppl.decoding.text.builders import word_count, words_at  # noqa: E402
from llamppl.inference import enumerate_exact  # noqa: E402
from llamppl.models import HardConstraint  # noqa: E402

CONSTRAINTS = [
    words_at({-1: "ran"}, plain=False),
    words_at({-1: "ran"}),
    words_at({-2: "He", -1: "ran"}, plain=False),
    word_count(at_most=2, plain=False) & words_at({-1: "ran"}, plain=False),
]


@pytest.mark.parametrize("constraint", CONSTRAINTS, ids=repr)
@pytest.mark.parametrize("proposal", ["mask", "lazy", "sample"])
def test_the_last_word_gives_the_exact_posterior(constraint, proposal):
    n = 4
    target, z = brute(constraint, n)
    exact = run(enumerate_exact(HardConstraint(LM, [0], constraint, proposal, n)))
    assert exact.log_ml == pytest.approx(math.log(z), abs=1e-10)
    assert exact.posterior.keys() == target.keys()
    for key, w in target.items():
        assert exact.posterior[key] == pytest.approx(w, abs=1e-10)


MARKS = ["He", " ran", ".", " !", '"', " b", "ran", "<eos>"]  # marks after a last word
MLM = FunctionLM(MARKS, len(MARKS) - 1, lambda ctx: [0.0] * len(MARKS))


@pytest.mark.parametrize("lm", [LM, MLM], ids=["pieces", "marks"])
@pytest.mark.parametrize("constraint", CONSTRAINTS, ids=repr)
def test_the_budget_never_refuses_a_passing_sequence(constraint, lm):
    n = 5 if lm is LM else 4
    passing, eos = 0, lm.eos_token_id
    for k in range(1, n + 1):
        for seq in itertools.product(range(lm.vocab_size), repeat=k):
            if eos in seq[:-1] or (seq[-1] != eos and k < n):
                continue
            text = "".join(lm.vocab[t] for t in seq if t != eos)
            if not constraint.accepts_end(text):
                continue
            passing += 1
            state = constraint.start(lm)
            for j, token in enumerate(seq):
                left = n - j  # tokens this sequence may still spend, its next one included
                assert constraint.need(lm, state) <= len(seq) - j, (text, j)
                assert constraint.reachable(lm, state, left), (text, j)
                mask = constraint.budget_mask(lm, state, left)
                assert mask is None or bool(mask[token]), (text, j)
                if token != eos:
                    state = constraint.advance(lm, state, token)
    assert passing > 5


def test_the_budget_steers_toward_writing_the_last_word(smollm):
    lm = smollm
    c = words_at({-1: "ocean"}, plain=False)
    assert c.need(lm, "The sea is") >= 1  # the word is still to write
    assert c.need(lm, "The sea is the oce") <= c.need(lm, "The sea is the")
    assert c.need(lm, "The sea is the ocean") == 0 and c.need(lm, "The deep ocean ") == 0
    assert c.need(lm, "The deep ocean is") >= 1  # another last word: write it again
    assert c.need(lm, "He saw the ocean. !") == 0  # marks after it: it may be the last word
    need = c.need(lm, "The sea is the")
    assert not c.reachable(lm, "The sea is the", need - 1)
    mask = c.budget_mask(lm, "The sea is the", need)  # no token to spare
    kept = {lm.vocab[i] for i in mask.nonzero().flatten().tolist()}
    assert " ocean" in kept and " sky" not in kept and len(kept) < lm.vocab_size // 10
    assert c.budget_mask(lm, "The sea is the", need + 3) is None  # room to spare
