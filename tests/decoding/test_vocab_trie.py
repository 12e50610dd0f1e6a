"""The vocabulary's radix trie lists exactly the tokens a prefix-closed check allows, with few checks.

Every listing is compared with the token-by-token scan (the definition) on seeded random
vocabularies and on checks that are closed under prefixes; the check counts are bounded by
the trie's node count and, for a selective check, far below the vocabulary size.
"""

from __future__ import annotations

import random
import re
import string

import pytest
import torch

from llamppl.decoding.proposals.vocab_trie import VocabTrie


def _vocab(seed: int, n: int = 400) -> list[str]:
    rng = random.Random(seed)
    letters = "ab( )1"
    vocab = {"".join(rng.choice(letters) for _ in range(rng.randint(1, 6))) for _ in range(n)}
    return sorted(vocab) + [""]  # one token with the empty string


def _balanced_prefix(text: str) -> bool:
    """Closed under prefixes: the parentheses never close more than they opened."""
    depth = 0
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return True


CHECKS = {
    "balanced": _balanced_prefix,
    "no-double-space": lambda t: "  " not in t,
    "ones-last": lambda t: re.fullmatch(r"[ab( )]*1*", t) is not None,
    "nothing": lambda t: t == "",
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(CHECKS))
@pytest.mark.parametrize("text", ["", "ab(", "a)"])
def test_the_walk_lists_what_the_scan_lists(seed, name, text):
    vocab = _vocab(seed)
    skip = (3, 7)
    trie = VocabTrie(vocab, skip)
    calls: list[str] = []

    def check(x: str) -> bool:
        calls.append(x)
        return CHECKS[name](text + x)

    found, checks = trie.allowed(check)
    scan = [i for i, t in enumerate(vocab) if i not in skip and CHECKS[name](text + t)]
    assert sorted(found) == scan
    assert checks == len(calls) <= trie.nodes + 1  # each node at most once, plus the root
    assert len(set(calls)) == len(calls)


def test_a_selective_check_costs_a_fraction_of_the_scan():
    rng = random.Random(5)
    alphabet = string.ascii_lowercase + string.digits + "()=#"
    vocab = sorted({"".join(rng.choices(alphabet, k=rng.randint(1, 8))) for _ in range(5000)})
    trie = VocabTrie(vocab)
    found, checks = trie.allowed(lambda x: x.startswith("(") or "(".startswith(x))
    assert sorted(found) == [i for i, t in enumerate(vocab) if t.startswith("(")]
    # the root's children (one per first character) plus the subtree under "("
    assert checks < len(vocab) // 10
    nothing, checks = trie.allowed(lambda x: x == "")
    assert nothing == [] and checks == len(alphabet)  # one check per first character


def test_a_budget_stops_the_walk():
    trie = VocabTrie(_vocab(3))
    full, checks = trie.allowed(lambda x: True)
    assert len(full) == len(_vocab(3)) and checks == trie.nodes + 1
    assert trie.allowed(lambda x: True, budget=10) == (None, 10)
    found, _ = trie.allowed(lambda x: True, budget=checks)
    assert sorted(found) == sorted(full)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_a_live_mask_skips_subtrees_without_a_live_token(seed, name):
    """With ``live`` (the tokens of positive probability after a cheap mask) the walk finds the
    same live allowed tokens, checks only nodes with a live token below, and fewer of them."""
    vocab = _vocab(seed)
    trie = VocabTrie(vocab)
    rng = random.Random(seed)
    finite = torch.tensor([rng.random() < 0.1 for _ in vocab])
    below = {}  # node text -> its tokens, from the strings themselves

    def check(x: str) -> bool:
        below[x] = [i for i, t in enumerate(vocab) if t.startswith(x)]
        return CHECKS[name](x)

    found, checks = trie.allowed(check, live=trie.live(finite))
    scan = {i for i, t in enumerate(vocab) if CHECKS[name](t) and finite[i]}
    assert {i for i in found if finite[i]} == scan
    assert all(any(finite[i] for i in ids) for ids in below.values())  # only live nodes checked
    assert checks < trie.allowed(lambda x: CHECKS[name](x))[1]
