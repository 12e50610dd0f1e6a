"""The prefix analysis (:mod:`llamppl.decoding.text.prefix`) by brute force against NLTK.

For every prefix ``p`` of a text ``T`` (seeded samples of the COLLIE reference texts, and
seeded random texts full of marks, quotes, hyphens, abbreviations, contractions and
newlines), what ``analyze(p)`` calls certain must hold in ``T``, one continuation of ``p``:
its certain sentences are ``T``'s first sentences, its certain words ``T``'s first words, and
the word being written may become ``T``'s word at that place. Extending a parent's analysis
gives the same answer as starting from scratch. Paragraphs likewise.
"""

from __future__ import annotations

import random
import string

import pytest

pytest.importorskip("nltk")

from text_programs import COLLIE_DATA, collie_instances  # noqa: E402

from llamppl.decoding.text import prefix as tp  # noqa: E402
from llamppl.decoding.text import units as tu  # noqa: E402
from llamppl.decoding.text.paragraphs import analyze_paragraphs  # noqa: E402
from llamppl.decoding.text.prefix import analyze, floor_words, word_floor  # noqa: E402

PIECES = [
    "He", "ran", "far", "Mr.", "U.S.", "don't", "gonna", "cannot", "well-known", "x--y",
    "3.5", "1)", "(see", "it)", "\"Yes,\"", "'quote'", "end.", "Why?", "No!", "a,", "b;",
    "c:", "e.g.", "...", "she", "St.", "Dr.", "It's", "co-op", "\u2019s", "\u201cHi\u201d",
]  # fmt: skip
GAPS = [" ", " ", " ", " ", "  ", "\n", "\n\n", ". ", "! ", "? "]


def _random_text(rng: random.Random, n: int) -> str:
    out = []
    for _ in range(n):
        out.append(rng.choice(PIECES))
        out.append(rng.choice(GAPS))
    return "".join(out).rstrip()


def _texts() -> list[str]:
    rng = random.Random(7)
    texts = [_random_text(rng, rng.randint(4, 14)) for _ in range(24)]
    if COLLIE_DATA.is_file():
        refs = sorted({i["example"] for i in collie_instances() if len(i["example"]) < 400})
        texts += random.Random(3).sample(refs, 16)
    return texts


def _check_sentence_view(prefix: str, whole: str) -> None:
    a = analyze(prefix)
    sentences, words = tu.sentences(whole), tu.words(whole)
    assert [s.text for s in a.sentences] == sentences[: len(a.sentences)], prefix
    certain = list(a.flat) + list(a.open_flat)
    assert certain == words[: len(certain)], prefix
    if a.open_word is not None and len(certain) < len(words):
        assert a.open_word.may_become(tu.normalize(words[len(certain)])), prefix
    if a.exact and a.sentences != tuple() and len(a.sentences) < len(sentences):
        nested = tu.words(sentences[len(a.sentences)])
        assert list(a.open_nested) == nested[: len(a.open_nested)], prefix


def _check_word_floor(prefix: str, whole: str) -> None:
    """``whole`` (a continuation of ``prefix``) has at least ``word_floor(prefix)`` words, and
    when it has exactly the certain sentences' words and ``floor_words``, each entry is one
    of its words: a certain word or complete chunk as it compares, the last chunk a start
    of it (or it with punctuation after)."""
    a = analyze(prefix)
    words = tu.words(whole)
    assert len(words) >= word_floor(prefix, a), (prefix, whole)
    entries = floor_words(prefix, a)
    if len(words) != len(a.flat) + len(entries):
        return
    for (kind, unit), word in zip(entries, words[len(a.flat) :]):
        got = tu.normalize(word)
        if kind != "open":
            assert tu.normalize(unit) == got, (prefix, whole, unit, word)
        else:
            core = unit.lower().lstrip(string.punctuation + " ")
            assert got.startswith(core) or core.rstrip(string.punctuation + " ") == got, (
                prefix,
                whole,
                unit,
                word,
            )


@pytest.mark.parametrize("chunk", range(4))
def test_everything_called_certain_holds_in_the_whole_text(chunk):
    texts = _texts()[chunk::4]
    for whole in texts:
        for i in range(len(whole) + 1):
            _check_sentence_view(whole[:i], whole)
            _check_word_floor(whole[:i], whole)


def test_the_word_floor_holds_when_only_punctuation_follows():
    """The cases where the floor is all the words: a prefix followed by marks, quotes or
    letters glued to its last chunk (no new chunk with a letter), on seeded texts."""
    tails = [
        "",
        ".",
        "...",
        "!",
        "?",
        ",",
        "'",
        "'s",
        "n't",
        '"',
        ")",
        ". .",
        "x",
        "x.",
        " ,",
        " ...",
    ]
    rng = random.Random(17)
    for whole in _texts()[::2]:
        for i in sorted(rng.sample(range(len(whole) + 1), min(12, len(whole) + 1))):
            for tail in rng.sample(tails, 5):
                _check_word_floor(whole[:i], whole[:i] + tail)


def test_a_parents_analysis_gives_the_same_answer():
    rng = random.Random(11)
    for _ in range(30):
        whole = _random_text(rng, 8) + "zz"  # a suffix never seen: fresh memo entries
        cuts = sorted(rng.sample(range(1, len(whole)), 3))
        for a, b in zip(cuts, cuts[1:]):
            analyze(whole[:a])
            with_parent = analyze(whole[:b], whole[:a])
            tp._ANALYSES.clear()  # forget every analysis: the next one starts from scratch
            assert with_parent == analyze(whole[:b]), whole[:b]


def test_paragraphs_called_final_are_final():
    rng = random.Random(5)
    for _ in range(25):
        whole = _random_text(rng, 10)
        paragraphs = tu.paragraphs(whole)
        for i in range(len(whole) + 1):
            p = analyze_paragraphs(whole[:i])
            for k, sentences in enumerate(p.final):
                assert list(sentences) == tu.sentences(paragraphs[k]), whole[:i]


def test_runs_of_spaces_keep_the_analysis_exact():
    """The Treebank rules split on runs of spaces, so a second space adds no word: the region
    stays exact (a dead end such as an 8th word that can no longer be "tv" is refused), and
    on seeded texts with runs of spaces nothing called certain differs from the judge."""
    a = analyze("The word six to with a variant  thi")
    assert a.exact and len(a.open_flat) == 7 and a.open_word.letters == "thi"
    words = ["He", "ran", "don't", "cannot", "gonna", "a,", "b;", "well-known", "'q'", "(see"]
    rng = random.Random(13)
    for _ in range(40):
        n = rng.randint(3, 8)
        whole = "".join(rng.choice(words) + rng.choice([" ", "  ", "   "]) for _ in range(n))
        for i in range(len(whole) + 1):
            _check_sentence_view(whole[:i], whole.rstrip())
