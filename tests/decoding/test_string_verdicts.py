"""Every constraint judges strings: ``accepts_prefix`` / ``accepts_end`` equal the token-level walk.

For text constraints, SMILES, predicates and conjunctions, on seeded random texts near each
constraint's language: the string verdicts equal the walk (``start`` / ``allows`` /
``advance`` / ``ends``) of random spellings on a FunctionLM of characters and 2-4 character
pieces. A constraint with a state of its own and no text interface is judged by the walk
of its characters; ``canonical`` by the walk of the tokenizer's own spelling, on a toy BPE
where every spelling of every short string is enumerated.
"""

from __future__ import annotations

import itertools
import random

import pytest
from string_walks import assert_agree, chunk_lm, random_texts, token_walk
from text_programs import use_shared_nltk_data

from llamppl import FunctionLM
from llamppl.constraints import (
    Constraint,
    PredicateConstraint,
    banned_words,
    canonical,
    char_count,
    chars_at,
    contains_words,
    excludes_words,
    last_word_of_sentences,
    max_word_length,
    regex_prefix,
    sentence_count,
    word_count,
)

SENTENCES = ["The cat sat. A dog ran far away.", "He is here. She went home now.", "Fish swim."]


def _balanced_so_far(text: str) -> bool:
    depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return True


def _closed():
    return PredicateConstraint(
        _balanced_so_far, prefix_closed=True, complete=lambda t: t.count("(") == t.count(")")
    )


CHARACTER_CASES = {
    "max_word_length": (lambda: max_word_length(4), SENTENCES),
    "banned_words": (lambda: banned_words(["dog", "sea"]), SENTENCES),
    "regex_prefix": (lambda: regex_prefix(r"(ab)+c"), ["ababc", "abc"]),
    "predicate": (_closed, ["(()())", "()", "(a)(b)"]),
    "conjunction": (lambda: max_word_length(5) & banned_words(["dog"]) & _closed(), SENTENCES),
}
STRUCTURE_CASES = {
    "char_count": (lambda: char_count(at_most=20), SENTENCES),
    "chars_at": (lambda: chars_at({2: "e"}), SENTENCES),
    "word_count": (lambda: word_count(exactly=6), SENTENCES),
    "sentence_count": (lambda: sentence_count(exactly=2), SENTENCES),
    "contains_words": (lambda: contains_words(["dog"]), SENTENCES),
    "excludes_words": (lambda: excludes_words(["dog"]), SENTENCES),
    "last_word_of_sentences": (lambda: last_word_of_sentences(["sat", "away"]), SENTENCES),
    "counts_and_words": (lambda: word_count(at_most=8) & max_word_length(5), SENTENCES),
}


def _agree(name, build, seeds):
    rng = random.Random(sum(map(ord, name)))
    texts = random_texts(seeds, rng, 80, extra=" .")
    prefixes, ends = assert_agree(build(), texts, chunk_lm(texts, rng), rng)
    assert 0 < prefixes < len(texts) and ends > 0, (name, prefixes, ends)


@pytest.mark.parametrize("name", sorted(CHARACTER_CASES))
def test_character_constraints_judge_as_the_walk(name):
    _agree(name, *CHARACTER_CASES[name])


@pytest.mark.parametrize("name", sorted(STRUCTURE_CASES))
def test_text_structure_judges_as_the_walk(name):
    pytest.importorskip("nltk")
    use_shared_nltk_data()
    _agree(name, *STRUCTURE_CASES[name])


def test_smiles_judges_as_the_walk():
    pytest.importorskip("partialsmiles")
    from llamppl.constraints import smiles

    _agree("smiles", smiles, ["CC(=O)O", "c1ccccc1", "C1CC1Br", "[Al]Cl"])


def test_an_undeclared_predicate_answers_with_its_own_check():
    """Not declared closed under prefixes: accepts_prefix is fn(text), the walk's last step;
    a walk through a spelling with a refused earlier boundary refuses it sooner."""
    c = PredicateConstraint(lambda t: t.count(")") <= t.count("("), complete=lambda t: t == "()")
    assert c.accepts_prefix(")(") and not c.accepts_prefix(")")
    lm = FunctionLM(["<s>", "(", ")", ")(", "</s>"], 4, lambda ctx: [0.0] * 5, bos_token_id=0)
    assert token_walk(c, lm, [3]) == (True, False)  # one token: the walk asked fn(")(") only
    assert token_walk(c, lm, [2, 1]) == (False, False)  # ")" first: refused there
    assert c.accepts_end("()") and token_walk(c, lm, [1, 2]) == (True, True)


class Parity(Constraint):
    """A constraint with a state of its own (the count of 'a' so far) and no text interface:
    an even count at the end, never three 'a' in a row."""

    def start(self, lm):
        return (0, 0)

    def allows(self, lm, state, token):
        run = state[1]
        for char in lm.vocab[token]:
            run = run + 1 if char == "a" else 0
            if run == 3:
                return False
        return True

    def advance(self, lm, state, token):
        text = lm.vocab[token]
        run = state[1]
        for char in text:
            run = run + 1 if char == "a" else 0
        return (state[0] + text.count("a"), run)

    def ends(self, lm, state):
        return state[0] % 2 == 0


def test_a_constraint_with_its_own_state_is_judged_by_its_walk():
    rng = random.Random(3)
    texts = random_texts(["abab", "aab", "baab"], rng, 60)
    prefixes, ends = assert_agree(Parity(), texts, chunk_lm(texts, rng), rng)
    assert 0 < ends < prefixes < len(texts)
    assert Parity().accepts_prefix("aab") and not Parity().accepts_prefix("baaab")
    assert (Parity() & max_word_length(3)).accepts_end("aab ab") is False  # 3 letters, odd


MERGES = [("a", "b"), ("b", "b"), ("ab", "a"), ("b", "a")]  # by rank
VOCAB = ["a", "b", "ab", "bb", "aba", "ba", "."]


class BPELM(FunctionLM):
    """A FunctionLM whose ``encode`` is byte-pair encoding with ``MERGES``."""

    def encode(self, text: str) -> list[int]:
        parts = list(text)
        while True:
            ranked = [
                (MERGES.index(pair), i)
                for i, pair in enumerate(zip(parts, parts[1:]))
                if pair in MERGES
            ]
            if not ranked:
                return [self.vocab.index(p) for p in parts]
            x, y = MERGES[min(ranked)[0]]
            out, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == (x, y):
                    out, i = out + [x + y], i + 2
                else:
                    out, i = out + [parts[i]], i + 1
            parts = out


def _spellings(lm, text):
    if not text:
        yield []
        return
    for i, token in enumerate(lm.vocab[:-1]):
        if text.startswith(token):
            for rest in _spellings(lm, text[len(token) :]):
                yield [i, *rest]


@pytest.mark.parametrize("after", [None, "a", "b"])
def test_canonical_judges_the_tokenizers_own_spelling(after):
    lm = BPELM(VOCAB, 6, lambda ctx: [0.0] * 7)
    c = canonical(after=None if after is None else VOCAB.index(after), lm=lm)
    for n in range(1, 6):
        for text in map("".join, itertools.product("ab", repeat=n)):
            walks = {tuple(t): token_walk(c, lm, t) for t in _spellings(lm, text)}
            own = tuple(lm.encode(text))
            assert (c.accepts_prefix(text), c.accepts_end(text)) == walks[own]
            ends = [t for t, (_, end) in walks.items() if end]
            assert ends == ([own] if c.accepts_end(text) else []), text  # no other spelling
            assert c.accepts_prefix(text) == any(p for p, _ in walks.values()), text
    with pytest.raises(ValueError, match="lm="):
        canonical().accepts_end("ab")
