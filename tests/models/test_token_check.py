"""``TokenCheck.exhaust`` (the listing of a lazy draw) equals the token-by-token scan.

The listing walks the vocabulary's trie with the constraint's text check, then checks each
listed token's budget; the scan asks ``TokenCheck(w)`` token by token. On a check closed
under prefixes both must give the same allowed set A, end tokens (EOS and, under
``stop="newline"``, every newline token) and budgets included, with or without a row whose
zero-probability tokens the listing may skip.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from llamppl import FunctionLM
from llamppl.decoding.constraints.protocol import PredicateConstraint
from llamppl.decoding.proposals import token_check
from llamppl.decoding.proposals.constrained_tokens import end_token_ids

VOCAB = ["".join(t) for k in (1, 2) for t in itertools.product("abcz", repeat=k)]
VOCAB += ["\n", "a\n", "z\n", "<eos>"]
EOS = len(VOCAB) - 1
LM = FunctionLM(VOCAB, EOS, lambda ctx: [0.0] * len(VOCAB))


def _prefix_ok(text: str) -> bool:
    """No "zz" and at most 5 characters: closed under prefixes."""
    return "zz" not in text and len(text) <= 5


class Budgeted(PredicateConstraint):
    """A text may end once it has at least 3 characters; ``reachable`` knows that a token
    adds at most 2 characters and the end takes a token (sound and exact)."""

    def accepts_end(self, text: str) -> bool:
        return _prefix_ok(text) and len(text) >= 3

    def reachable(self, lm, state: str, tokens_left: int) -> bool:
        return tokens_left >= 1 + max(0, math.ceil((3 - len(state)) / 2))


def _check(c, state, left, end_ids, counted=lambda: None):
    return token_check.TokenCheck(
        c,
        LM,
        state,
        lambda s, w: c.allows(LM, s, w),
        end_ids,
        only_end=False,
        left=left,
        counted=counted,
        context=(0,),
    )


@pytest.mark.parametrize("stop", ["eos", "newline"])
@pytest.mark.parametrize("left", [None, 1, 2, 3, 6])
@pytest.mark.parametrize("state", ["", "a", "az", "abc", "abcab"])
@pytest.mark.parametrize("with_row", [False, True])
def test_exhaust_lists_exactly_what_the_scan_allows(stop, left, state, with_row):
    c = Budgeted(_prefix_ok, prefix_closed=True)
    end_ids = end_token_ids(LM, stop)
    row = torch.zeros(len(VOCAB))
    if with_row:  # every third token has probability 0: the listing may skip it
        row[::3] = -math.inf
    positive = {w for w in range(len(VOCAB)) if row[w] > -math.inf}
    scan = {w for w in positive if _check(c, state, left, end_ids)(w)}
    check = _check(c, state, left, end_ids)
    exhaust = check.exhauster(row=row if with_row else None)
    found, checks = exhaust(10**9)
    assert found is not None and checks > 0
    assert {w for w in found if w in positive} == scan
    if stop == "newline" and c.ends(LM, state):  # the newline tokens end the text here
        assert {w for w in end_ids if w in positive} <= set(found)


def test_exhaust_resumes_within_its_budget_and_ends_with_the_scans_answer():
    c = Budgeted(_prefix_ok, prefix_closed=True)
    end_ids = end_token_ids(LM, "newline")
    scan = {w for w in range(len(VOCAB)) if _check(c, "ab", 3, end_ids)(w)}
    check = _check(c, "ab", 3, end_ids)
    calls = 0
    while True:
        found, checks = check.exhaust(2)
        calls += 1
        assert checks <= 2 + 1  # at most the budget (and the end token's one check)
        if found is not None:
            break
    assert calls > 3 and set(found) == scan


def test_an_undeclared_plain_callable_has_no_listing():
    c = PredicateConstraint(_prefix_ok)  # not declared closed under prefixes
    assert _check(c, "a", None, end_token_ids(LM, "eos")).exhauster() is None
