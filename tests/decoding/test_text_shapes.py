"""The joint prefix check of text builders under plain characters (``llamppl.decoding.text.feasible``).

1. **Reading**: on seeded plain texts with marks, abbreviations, initials, contractions and
   paragraph breaks, one reading of ``shape.read`` gives exactly the judge's words, the
   words of each sentence and the sentences of each paragraph.
2. **Sound**: for seeded plain texts, conjunctions built from what each text is (its counts,
   positions, first and last words, required and absent words, word lengths) accept every
   character prefix of it: the joint part never refuses a prefix some continuation
   completes, so the target does not change.
3. **Exact** (a property, hypothesis derandomised): random compositions of the builders and
   random prefixes they accept, reached by a walk over plain pieces: a search over the same
   pieces finds a completion the judge accepts; and a prefix that every given part accepts
   but the conjunction refuses has no completion of up to two pieces.
4. The newcomer's case: ``sentence_count(exactly=3) & words_per_sentence(exactly=6)`` refuses
   ``"In a garden, Emily in the "`` and returns texts on the embedded model.
5. **Same posterior**: ``enumerate_exact`` of ``HardConstraint`` on a composition that used to
   dead-end equals a brute-force sum over token sequences, for every proposal.
"""

from __future__ import annotations

import math
import random

import pytest

pytest.importorskip("nltk")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from text_programs import brute  # noqa: E402

from llamppl import FunctionLM, run  # noqa: E402
from llamppl.constraints import (  # noqa: E402
    PredicateConstraint,
    chars_per_word,
    contains_words,
    excludes_words,
    first_word_of_sentences,
    last_sentence_of_paragraphs,
    last_word_of_sentences,
    paragraph_count,
    sentence_count,
    sentences_per_paragraph,
    word_count,
    words_at,
    words_per_sentence,
)
from llamppl.decoding.constraints.protocol import AllOf  # noqa: E402
from llamppl.decoding.constraints.time_bound import time_bound  # noqa: E402
from llamppl.decoding.text import units as tu  # noqa: E402
from llamppl.decoding.text.feasible import ShapeFit  # noqa: E402
from llamppl.decoding.text.plain import PlainCharacters  # noqa: E402
from llamppl.decoding.text.prefix import analyze  # noqa: E402
from llamppl.decoding.text.shape import PARA, STOP, read  # noqa: E402
from llamppl.inference import enumerate_exact  # noqa: E402
from llamppl.models import HardConstraint  # noqa: E402


def _conj(parts):
    c = parts[0]
    for p in parts[1:]:
        c = c & p
    return c


def _fit(c: AllOf) -> ShapeFit:
    return next(p for p in c.parts if isinstance(p, ShapeFit))


def _plain(c: AllOf) -> PlainCharacters:
    return next(p for p in c.parts if isinstance(p, PlainCharacters))


# ---------------------------------------------------------------------- 1. reading
HARD = [
    " sun", " tree", " the", " garden", " She", " ran", " a", " I", " Mr.", " Dr.", " don't",
    " can't", " gonna", " cannot", " it's", " students'", " o'clock", ".", ".", "!", "?", ",",
    ";", " The", " U", "n", "'s", " St.", " No.", " vs.", "\n\n",
]  # fmt: skip
STARTS = ["Sun", "The", "She", "Mr.", "A", "I", "It's", "Don't"]


def _hard_text(rng: random.Random, paragraphs: bool) -> str:
    pieces = [p for p in HARD if paragraphs or p != "\n\n"]
    return rng.choice(STARTS) + "".join(rng.choice(pieces) for _ in range(rng.randint(2, 14)))


def _units(events: tuple) -> tuple[list, list, list]:
    """Words, the words of each sentence and the sentence count of each paragraph that a
    stream of events stands for."""
    words, sentences, paragraphs = [], [], []
    sentence: list = []
    counted, open_ = 0, False
    for e in events:
        if e is STOP:
            sentences.append(sentence)
            sentence, counted, open_ = [], counted + 1, False
        elif e is PARA:
            paragraphs.append(counted + open_)
            counted, open_ = 0, False
        else:
            words.append(tu.normalize(e))
            sentence.append(tu.normalize(e))
            open_ = True
    if sentence:
        sentences.append(sentence)
    paragraphs.append(counted + open_)
    return words, sentences, paragraphs


def test_a_reading_of_a_plain_text_is_the_judges_units():
    rng, checked = random.Random(0), 0
    strict = PlainCharacters(True, spaced_marks=True, max_run=20, open_marks=False)
    while checked < 150:
        text = _hard_text(rng, rng.random() < 0.5)
        if not strict(text):
            continue
        checked += 1
        certain, readings = read(text, analyze(text))
        judge = (
            [tu.normalize(w) for w in tu.words(text)],
            [[tu.normalize(w) for w in s] for s in tu.nested_units(text, "sentence", "word")],
            [len(p) for p in tu.nested_units(text, "paragraph", "sentence")],
        )
        found = []
        for r in readings:  # the last chunk ends the text as it is
            last = r.open_word or r.open_chunk
            tail = tuple(tu.span_words(" " + last)) if last else ()
            found.append(_units(certain + r.events + tail))
        assert judge in found, (text, judge, found)


# ---------------------------------------------------------------------- 2. sound
def _around(rng: random.Random, v: int) -> dict:
    """Bounds that hold for ``v``."""
    kind = rng.randrange(4)
    if kind == 0:
        return {"exactly": v}
    if kind == 1:
        return {"at_least": rng.randint(0, v)}
    if kind == 2:
        return {"at_most": v + rng.randint(0, 2)}
    return {"at_least": rng.randint(0, v), "at_most": v + rng.randint(0, 1)}


def _builders_of(text: str, rng: random.Random) -> list:
    """Builders the text passes: its own counts, positions, first and last words, ..."""
    words = tu.words(text)
    nested = tu.nested_units(text, "sentence", "word")
    paragraphs = tu.nested_units(text, "paragraph", "sentence")
    out = [
        word_count(**_around(rng, len(words))),
        sentence_count(**_around(rng, len(nested))),
        paragraph_count(**_around(rng, len(paragraphs))),
        sentences_per_paragraph(**_around(rng, min(len(p) for p in paragraphs))),
    ]
    if nested and all(nested) and all(w for s in nested for w in s):
        lengths = [len(s) for s in nested]
        out.append(words_per_sentence(at_least=min(lengths), at_most=max(lengths)))
        firsts, lasts = [s[0] for s in nested], [s[-1] for s in nested]
        out += [first_word_of_sentences(firsts), last_word_of_sentences(lasts)]
        if len({tu.normalize(w) for w in lasts}) == 1:
            out.append(last_word_of_sentences(lasts[0]))
        if len(paragraphs) > 1 and all(p and all(p) for p in paragraphs):
            out.append(last_sentence_of_paragraphs([p[-1] for p in paragraphs]))
    if words and all(words):
        lengths = [len(w) for w in words]
        out.append(chars_per_word(at_least=min(lengths), at_most=max(lengths)))
        picks = rng.sample(range(len(words)), min(2, len(words)))
        out.append(
            words_at({(i if rng.random() < 0.5 else i - len(words)): words[i] for i in picks})
        )
        out.append(contains_words([words[i] for i in picks]))
    present = {tu.normalize(w) for w in words}
    out.append(
        excludes_words([w for w in ("ocean", "bird", "tree") if w not in present][:1] or ["zebra"])
    )
    return out


def test_the_joint_check_accepts_every_prefix_of_every_text_it_should():
    rng, checked = random.Random(1), 0
    while checked < 80:
        text = _hard_text(rng, rng.random() < 0.4)
        options = _builders_of(text, rng)
        c = _conj(rng.sample(options, rng.randint(2, 4)))
        fit = [p for p in c.parts if isinstance(p, ShapeFit)]
        if not fit or not _plain(c)(text):
            continue
        assert all(p.accepts_end(text) for p in c.given), (c, text)
        checked += 1
        refused = [text[:i] for i in range(len(text) + 1) if not fit[0](text[:i])]
        assert not refused, (c, text, refused[:1])


# ---------------------------------------------------------------------- 3. exact
WORDS = ["sun", "tree", "sea", "ocean", "the", "garden", "she", "ran", "it", "go"]
PIECES = [".", "!", "?", "\n\n", ","] + [" " + w for w in WORDS]
PIECES += [" She", " oce", "an", "s", "t", "k", "'t", "'s", "'"]  # ``Garden't``: ``Garde``, ``n't``
GLUE = ("an", "s", "t", "k", "'t", "'s", "'")  # pieces that only go on a word


def _pieces(c: AllOf, text: str) -> list[str]:
    """The pieces that may follow ``text``."""
    if text == "":
        starts = [w.capitalize() for w in WORDS] + ["Oce"]
        return starts + (["\n\n"] if "\n" in _plain(c).chars else [])
    ps = [p for p in PIECES if p != "\n\n" or "\n" in _plain(c).chars]
    return [p for p in ps if p not in GLUE or text[-1:].isalpha() or text[-1:] == "'"]


def _key(c: AllOf, text: str):
    """Texts in the same joint states that end in the same unfinished word are explored once."""
    states = _fit(c).states(text)
    run_ = len(text) - len(text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'"))
    tail = text[len(text) - run_ :].lower()
    word = tail if any(w.startswith(tail) for w in WORDS) else len(tail)
    return text if states is None else (frozenset(states), word, text[-1:])


def _completion(c: AllOf, text: str, depth: int = 30, budget: int = 3000) -> str | None:
    """Depth first over the pieces, pruned by the prefix check (sound: every prefix of a
    completion passes it): a completion the judge accepts, or None."""
    stack, seen, nodes = [(text, 0)], {_key(c, text)}, 0
    while stack and nodes < budget:
        t, d = stack.pop()
        nodes += 1
        if c.checked(True, t):
            return t
        if d < depth:
            for u in reversed([t + p for p in _pieces(c, t) if c.checked(False, t + p)]):
                k = _key(c, u)
                if k not in seen:
                    seen.add(k)
                    stack.append((u, d + 1))
    return None


def _bounds(draw, lo: int, hi: int) -> dict:
    a = draw(st.integers(lo, hi))
    kind = draw(st.sampled_from(["exactly", "at_least", "at_most", "both"]))
    if kind == "both":
        return {"at_least": a, "at_most": draw(st.integers(a, hi + 2))}
    return {kind: a}


@st.composite
def compositions(draw):
    word = st.sampled_from(WORDS)
    targets = st.one_of(word, st.lists(word, min_size=1, max_size=3))
    make = {
        "word_count": lambda: word_count(**_bounds(draw, 1, 10)),
        "sentence_count": lambda: sentence_count(**_bounds(draw, 1, 3)),
        "paragraph_count": lambda: paragraph_count(**_bounds(draw, 1, 3)),
        "words_at": lambda: words_at(
            draw(st.dictionaries(st.sampled_from([0, 1, 2, 3, -1, -2]), word, min_size=1))
        ),
        "chars_per_word": lambda: chars_per_word(**_bounds(draw, 2, 7)),
        "words_per_sentence": lambda: words_per_sentence(**_bounds(draw, 1, 6)),
        "sentences_per_paragraph": lambda: sentences_per_paragraph(**_bounds(draw, 1, 3)),
        "contains_words": lambda: contains_words(draw(st.lists(word, min_size=1, max_size=2))),
        "excludes_words": lambda: excludes_words(draw(st.lists(word, min_size=1, max_size=2))),
        "first_word_of_sentences": lambda: first_word_of_sentences(draw(targets)),
        "last_word_of_sentences": lambda: last_word_of_sentences(draw(targets)),
    }
    names = draw(st.lists(st.sampled_from(sorted(make)), min_size=2, max_size=3))
    return _conj([make[n]() for n in names])


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(c=compositions(), seed=st.integers(0, 2**16))
def test_every_accepted_prefix_has_a_completion_and_joint_refusals_have_none(c, seed):
    with time_bound(None):  # the verdicts, not their speed: no check may time out here
        _walk_and_complete(c, random.Random(seed))


def _walk_and_complete(c: AllOf, rng: random.Random) -> None:
    text, refusals = "", []
    for _ in range(rng.randint(0, 12)):  # a walk through prefixes the conjunction accepts
        nxt = [text + p for p in _pieces(c, text)]
        refusals += [u for u in nxt if not c(u) and all(p(u) for p in c.given)]
        ok = [u for u in nxt if c(u)]
        if not ok:
            break
        text = rng.choice(ok)
    if c(text):
        assert _completion(c, text) is not None, (c, text)
        cut = [text[:i] for i in range(len(text)) if not c(text[:i])]  # monotone, by character
        assert not cut, (c, text, cut[:1])
    for dead in refusals[-2:]:  # refused jointly: no completion of up to two pieces
        ends = [dead] + [dead + p for p in _pieces(c, dead)]
        ends += [u + p for u in ends[1:] for p in _pieces(c, u)]
        assert not any(c.checked(True, u) for u in ends), (c, dead)
        assert not any(c(u) for u in ends), (c, dead)  # monotone: what follows stays refused


@pytest.mark.parametrize(
    "builder, dead, alive",
    [
        (words_per_sentence(at_most=4), "The cat sat. A dog ran far away.", "The cat sat. A dog"),
        (words_at({1: "cat"}), "Birds sing.", "Birds"),
        (first_word_of_sentences("He"), "awc.", ""),
    ],
)
def test_a_builder_alone_refuses_a_mark_after_a_dead_end(builder, dead, alive):
    """A chunk with a mark still opens with a word of the open sentence: each builder's own
    check refuses it, as it refuses the same text without the mark."""
    assert builder(alive) and not builder(dead) and not builder(dead[:-1])
    assert not any(p(dead) for p in builder.given)


# ---------------------------------------------------------------------- 4. the newcomer's case
def _no_z(text: str) -> bool:
    return "z" not in text.lower()


NEWCOMER = (
    sentence_count(exactly=3)
    & words_per_sentence(exactly=6)
    & PredicateConstraint(_no_z, prefix_closed=True)
)


@pytest.mark.parametrize(
    "text, alive",
    [
        ("In a garden, Emily in the ", False),  # six words and a space: a seventh must come
        ("In a garden, Emily in the", True),  # "the" may end the sentence
        ("In a garden, Emily in the park. ", False),  # seven words: words_per_sentence alone
        ("In a garden, she sat. ", False),  # a sentence of five words
        ("A garden is a lovely place. It has green trees and roses", True),
        ("A garden is a lovely place. It has green trees and roses ", False),
        ("A garden is a lovely place. It has green trees and flowers. Birds sing", True),
    ],
)
def test_the_newcomers_composition_refuses_what_it_cannot_complete(text, alive):
    alone = "park" not in text  # each part alone lets the others through
    assert all(p(text) for p in NEWCOMER.given) is alone
    assert NEWCOMER(text) is alive


@pytest.mark.slow
def test_the_newcomers_composition_returns_texts(smollm):
    from llamppl.inference import smc_standard

    c = (
        sentence_count(exactly=2)
        & words_per_sentence(exactly=3)
        & PredicateConstraint(_no_z, prefix_closed=True)
    )
    m = HardConstraint(smollm, "Write two short sentences about a garden.", c, max_tokens=16)
    res = run(smc_standard(m, 4, seed=0))
    texts = [str(p) for p, w in zip(res.particles, res.log_weights) if w > -math.inf]
    assert texts and all(c.accepts_end(t) for t in texts)


# ---------------------------------------------------------------------- 5. same posterior
VOCAB = ["He", " ran", " far", ".", " b", "<eos>"]
SLM = FunctionLM(
    VOCAB,
    len(VOCAB) - 1,
    lambda ctx: (
        [math.cos(0.9 * i + 0.4 * len(ctx) + 0.3 * ctx[-1]) for i in range(5)]
        + [-1.5 + 0.5 * len(ctx)]
    ),
)


@pytest.mark.parametrize("proposal", ["mask", "lazy", "sample"])
def test_the_posterior_of_a_composition_that_dead_ended_is_exact(proposal):
    c = sentence_count(exactly=2) & words_per_sentence(exactly=2)
    assert all(p("He ran ") for p in c.given) and not c("He ran ")  # a dead end, now refused
    n = 5  # "He ran. b far", cut at the limit and judged whole
    target, z = brute(c, n, SLM)
    exact = run(enumerate_exact(HardConstraint(SLM, [0], c, proposal, n)))
    assert z > 0 and exact.log_ml == pytest.approx(math.log(z), abs=1e-10)
    assert exact.posterior.keys() == target.keys()
    for key, w in target.items():
        assert exact.posterior[key] == pytest.approx(w, abs=1e-10)
