"""What a conjunction of text constraints implies (``AllOf`` + ``Constraint.implied``), by brute force.

1. **Implied**: for every short text that passes the complete checks of an implied part's
   sources, every character prefix passes the implied part's prefix check and the text its
   complete check (so the joint target equals the plain conjunction's), on a vocabulary of
   word pieces, marks, runs of dots, quotes and abbreviations.
2. **Same posterior**: ``enumerate_exact`` of ``HardConstraint`` on ``a & b`` equals that of
   ``AllOf(a, b, imply=False)`` and a brute-force sum, to 1e-10, for every proposal.
3. **Tighter**: ``"... with the"`` is refused by ``word_count(exactly=8) &
   last_word_of_sentences(["ocean"])`` and accepted by each part alone; likewise for counts
   next to required words and to positions from the end.
4. **Composition**: nested conjunctions flatten by their given parts, ``repr`` shows them,
   the implied parts are recomputed, duplicates dropped.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

pytest.importorskip("nltk")

from text_programs import brute  # noqa: E402

from llamppl import FunctionLM, run  # noqa: E402
from llamppl.decoding.constraints.protocol import AllOf  # noqa: E402
from llamppl.decoding.text.builders import (  # noqa: E402
    contains_words,
    last_word_of_sentences,
    word_count,
    words_at,
)
from llamppl.decoding.text.joint import (  # noqa: E402
    CappedLastWords,
    RequiredWordsFit,
    SentenceEndsAtCap,
)
from llamppl.decoding.text.positions import UnitsAt  # noqa: E402
from llamppl.inference import enumerate_exact  # noqa: E402
from llamppl.models import HardConstraint  # noqa: E402

# pieces that make the judge's words and sentences hard: marks, runs of dots, quotes,
# abbreviations, contractions, a word that only starts the target
PIECES = [
    "A",
    " b",
    " sea",
    " ocean",
    " oce",
    "an",
    ".",
    "...",
    ",",
    "'",
    " o'",
    '"',
    " Mr.",
    "n't",
]
PIECES_SHORT = ["A", " b", " ocean", " oce", "an", ".", "...", "'", '"', " Mr."]
PIECES_TWO = ["A", " b", " sea.", " Sea", " Ocean", " oce", "an", ".", "...", "'", " Mr."]


def _texts(pieces: list[str], most: int, cap: int | None = None, sample: int = 4000) -> list[str]:
    """Every concatenation of at most 3 pieces and a seeded sample of ``sample`` longer ones
    (up to ``most``); with ``cap``, only those with at most ``cap`` chunks holding a letter
    (the others have more than ``cap`` words)."""
    out = {""}
    for k in range(1, min(3, most) + 1):
        out |= {"".join(seq) for seq in itertools.product(pieces, repeat=k)}
    rng = random.Random(len(pieces) * 100 + most)
    for _ in range(sample if most > 3 else 0):
        out.add("".join(rng.choice(pieces) for _ in range(rng.randint(4, most))))
    if cap is not None:
        out = {t for t in out if sum(any(ch.isalnum() for ch in c) for c in t.split()) <= cap}
    return sorted(out)


def _joint(c: AllOf, kind: type) -> list:
    found = [p for p in c.implied_parts if isinstance(p, kind)]
    assert found, f"{c!r} implies no {kind.__name__}: {c.implied_parts}"
    return found


CASES = [
    # (conjunction, the implied class, pieces, longest text in pieces)
    (word_count(exactly=3, plain=False) & last_word_of_sentences(["ocean"], plain=False), SentenceEndsAtCap, PIECES, 5),
    (word_count(at_most=3, plain=False) & last_word_of_sentences("ocean", plain=False), SentenceEndsAtCap, PIECES, 5),
    (word_count(at_most=3, plain=False) & last_word_of_sentences(["sea", "ocean"], plain=False), SentenceEndsAtCap, PIECES_TWO, 5),
    (word_count(at_most=2, plain=False) & words_at({-1: "ocean"}, plain=False), CappedLastWords, PIECES, 5),
    (word_count(at_most=3, plain=False) & words_at({-2: "b", -1: "ocean"}, plain=False), CappedLastWords, PIECES_SHORT, 5),
    (word_count(exactly=3, plain=False) & words_at({-1: "ocean"}, plain=False), UnitsAt, PIECES, 5),
    (word_count(exactly=3, plain=False) & words_at({-1: "ocean"}, plain=False), CappedLastWords, PIECES, 5),
    (word_count(at_most=3, plain=False) & contains_words(["ocean", "sea"], plain=False), RequiredWordsFit, PIECES, 5),
]  # fmt: skip


@pytest.mark.parametrize("conj, kind, pieces, most", CASES, ids=lambda x: repr(x)[:60])
def test_every_implied_part_holds_on_every_text_of_the_target(conj, kind, pieces, most):
    """The part's complete check holds on every text every given part accepts, and its prefix
    check (sound for it) accepts every character prefix of such a text."""
    parts = _joint(conj, kind)
    cap = conj.given[0].bounds.hi
    texts = _texts(pieces, most, cap)
    passing = [t for t in texts if all(p.checked(True, t) for p in conj.given)]
    assert len(passing) >= 3, passing  # the cases are not vacuous
    for part in parts:
        for text in passing:
            assert part.accepts_end(text), (part, text)
            bad = [text[:i] for i in range(len(text) + 1) if not part(text[:i])]
            assert not bad, (part, text, bad[:1])


# ---------------------------------------------------------------------- same posterior
LM_PIECES = ["A", " b", " oce", "an", " ocean", ".", "...", "<eos>"]
EOS = len(LM_PIECES) - 1
JLM = FunctionLM(
    LM_PIECES,
    EOS,
    lambda ctx: (
        [math.sin(1.3 * i + 0.7 * len(ctx) + 0.2 * ctx[-1]) for i in range(EOS)]
        + [-0.5 + 0.4 * len(ctx)]
    ),
)


@pytest.mark.parametrize(
    "conj",
    [
        word_count(exactly=2, plain=False) & last_word_of_sentences(["ocean"], plain=False),
        word_count(at_most=2, plain=False) & words_at({-1: "ocean"}, plain=False),
        word_count(exactly=2, plain=False) & words_at({-1: "ocean"}, plain=False),
        word_count(at_most=2, plain=False) & contains_words(["ocean", "b"], plain=False),
        word_count(exactly=2) & last_word_of_sentences(["ocean"]),  # plain characters on
    ],
    ids=repr,
)
@pytest.mark.parametrize("proposal", ["mask", "lazy"])
def test_the_joint_posterior_equals_the_plain_conjunctions(conj, proposal):
    n = 4
    assert conj.implied_parts
    alone = AllOf(*conj.given, *[p for p in conj.implied_parts if "plain" in repr(p)], imply=False)
    target, z = brute(conj, n, JLM)
    joint = run(enumerate_exact(HardConstraint(JLM, [0], conj, proposal, n)))
    plain = run(enumerate_exact(HardConstraint(JLM, [0], alone, proposal, n)))
    assert joint.log_ml == pytest.approx(math.log(z), abs=1e-10)
    assert plain.log_ml == pytest.approx(joint.log_ml, abs=1e-10)
    assert joint.posterior.keys() == plain.posterior.keys() == target.keys()
    for key, w in target.items():
        assert joint.posterior[key] == pytest.approx(w, abs=1e-10)
        assert plain.posterior[key] == pytest.approx(w, abs=1e-10)


# ---------------------------------------------------------------------- tighter
@pytest.mark.parametrize(
    "conj, dead",
    [
        (
            word_count(exactly=8) & last_word_of_sentences(["ocean"]),
            "The sea is calm and blue with the",  # the 8th word can no longer be "ocean"
        ),
        (
            word_count(exactly=8) & last_word_of_sentences(["ocean"]),
            "After setting his boat adrift, Mr. Black endures",  # marks: one word per chunk
        ),
        (
            word_count(exactly=8) & last_word_of_sentences(["ocean"]),
            "Tomorrow night, with the sun shining bright, o'",  # a quote after "o"
        ),
        (
            word_count(exactly=8) & last_word_of_sentences(["ocean", "home"]),
            "The sea is calm and blue with",  # the second sentence needs a word too
        ),
        (word_count(exactly=8) & words_at({-1: "ocean"}), "The sea is calm and blue with the"),
        (word_count(at_most=8) & words_at({-1: "ocean"}), "The sea is calm and blue with the"),
        (word_count(exactly=4) & contains_words(["ocean", "sea"]), "The blue sea is"),
        (word_count(exactly=4) & contains_words(["ocean", "sea"]), "The blue wide"),
    ],
)
def test_the_conjunction_refuses_what_no_continuation_completes(conj, dead):
    assert all(part(dead) for part in conj.given)  # each part alone lets it through
    assert not conj(dead)
    assert conj(dead.rsplit(" ", 1)[0])  # one word earlier it was alive


def test_a_position_from_the_end_is_as_tight_as_from_the_start_next_to_an_exact_count():
    from_end = word_count(exactly=4) & words_at({-1: "ocean"})
    from_start = word_count(exactly=4) & words_at({3: "ocean"})
    for text in _texts(["A", " b", " oce", "an", " ocean", ".", " the", ","], 4):
        assert from_end(text) == from_start(text), text


def test_the_joint_parts_hint_the_word_that_is_due(smollm):
    lm = smollm
    c = word_count(exactly=8) & last_word_of_sentences(["ocean"])
    assert [lm.vocab[h] for h in c.hint(lm, "The sea is calm and blue with")] == [" ocean"]
    assert [lm.vocab[h] for h in c.hint(lm, "The sea is calm and blue with oc")] == ["ean"]
    assert c.hint(lm, "The sea is calm and") == ()
    for h in c.hint(lm, "The sea is calm and blue with"):
        assert c.allows(lm, "The sea is calm and blue with", h)
    required = word_count(exactly=4) & contains_words(["ocean", "sea"])
    shown = {lm.vocab[h] for h in required.hint(lm, "The blue")}
    assert shown == {" ocean", " sea"}
    assert required.hint(lm, "The") == ()  # room to spare


# ---------------------------------------------------------------------- composition
def test_conjunctions_flatten_by_their_given_parts_and_recompute_what_is_implied():
    a, b = word_count(exactly=8), last_word_of_sentences(["ocean"])
    c = a & b
    assert repr(c) == "word_count(exactly=8) & each_at('sentence', 'word', -1, ('ocean',))"
    assert len(c.given) == 2 and len(c.implied_parts) == 3  # plain characters, two joint parts
    assert repr((a & b) & words_at({2: "sea"})) == repr(c & words_at({2: "sea"}))
    nested = AllOf(c, words_at({2: "sea"}))
    assert len(nested.given) == 3 and len([p for p in nested.parts if "plain" in repr(p)]) == 1
    assert "imply=False" in repr(AllOf(*c.given, imply=False))
    assert AllOf(*c.given, imply=False).implied_parts == ()
    with pytest.raises(TypeError, match="imply"):
        AllOf(a, imply="yes")


def test_implied_parts_name_bad_input():
    with pytest.raises(ValueError, match="cap"):
        CappedLastWords(-1, {-1: "x"}, [word_count(exactly=1)])
    with pytest.raises(ValueError, match="negative"):
        CappedLastWords(3, {1: "x"}, [word_count(exactly=1)])
    with pytest.raises(TypeError, match="sources"):
        RequiredWordsFit(3, ["x"], [])
    with pytest.raises(TypeError, match="targets"):
        SentenceEndsAtCap(3, [], [word_count(exactly=1)])
