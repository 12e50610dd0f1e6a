"""Plain characters (``llamppl.decoding.text.plain``): the text builders' default, exact.

- :class:`PlainCharacters`' mask equals the per-token scan (and the trie listing of the
  default mask) on a vocabulary of marks, quotes, newlines and word pieces;
- :func:`plain_characters` derives it from a conjunction's text constraints: the targets'
  characters, newlines only with paragraphs, the character set alone for character
  constraints, rules a target breaks lifted;
- the builders add it by default (one part per conjunction), ``plain=False`` leaves it out,
  and ``HardConstraint``'s posterior is the LM conditioned on the structure and plain
  characters, exactly.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("nltk")

from text_programs import LM, brute  # noqa: E402

from llamppl import FunctionLM, run  # noqa: E402
from llamppl.constraints import (  # noqa: E402
    PlainCharacters,
    char_count,
    chars_at,
    contains_words,
    last_sentence_of_paragraphs,
    paragraph_count,
    plain_characters,
    word_count,
    words_at,
)
from llamppl.decoding.constraints.protocol import AllOf, Constraint  # noqa: E402
from llamppl.decoding.text.plain import MAX_RUN  # noqa: E402
from llamppl.inference import enumerate_exact  # noqa: E402
from llamppl.models import HardConstraint  # noqa: E402

VOCAB = ["Pre", "-", "Pal", " jaw", ".", "\n", "(", "'s", " 'x", ",", " ,", "<eos>"]
MLM = FunctionLM(VOCAB, len(VOCAB) - 1, lambda ctx: [math.sin(i + len(ctx)) for i in range(12)])


def test_plain_characters_admit_the_targets_own_characters_and_space_the_marks():
    plain = plain_characters(
        word_count(exactly=11) & words_at({3: "jaw", 7: "Pre-Palaeolithic", 10: "II"})
    )
    assert plain.spaced_marks and {"-", "P", "I"} <= plain.chars
    assert plain("Pre-Palaeolithic jaw. Pre, jaw's.") and not plain("(jaw)")
    assert not plain("a\nb") and not plain("jaw.Pre") and not plain("jaw...")
    assert not PlainCharacters(newlines=False)("Pre-Palaeolithic")
    glued = plain_characters(paragraph_count(exactly=2) & contains_words(["U.S."]))
    assert not glued.spaced_marks and glued("U.S.\nPre")  # a target that glues a mark
    word = plain_characters(char_count(exactly=12))
    assert not word.spaced_marks and word("Celara,DEVN.")  # character constraints: no split
    assert word.max_run is None and plain.max_run == MAX_RUN
    assert plain("a" * 20 + " jaw") and not plain("a" * 21 + " jaw")  # no endless words
    long = plain_characters(word_count(exactly=3) & contains_words(["x" * 25]))
    assert long.max_run == 26 and long("x" * 25 + ".")  # a target's own run fits, a mark after it
    assert not plain.open_marks and plain("It's the students' jaw.") and not plain("A. 'jaw")
    assert not plain("the 'jaw'") and not plain("And,'jaw") and not plain("A: ''")  # quotes
    assert plain("the jaws' Pre")  # a quote right after a letter stays
    assert not plain("jaw  Pre") and not plain("jaw , Pre") and plain("jaw, Pre")  # spacing
    loose = plain_characters(word_count(exactly=3) & contains_words(["a  b"]))
    assert loose.open_marks and loose("a  b")  # a target's own spacing always fits
    assert not plain("A.  , jaw") and not plain("'jaw")  # no mark or quote opens a sentence
    assert word.open_marks and word("'jaw")
    assert plain_characters(word_count(exactly=3) & words_at({0: "'Tis"})).open_marks
    paragraphs = plain_characters(last_sentence_of_paragraphs(["Go home.", "Stay"]))
    assert "\n" in paragraphs.chars and paragraphs("Go home.\n\nStay")


@pytest.mark.parametrize(
    "c",
    [
        plain_characters(word_count(exactly=11) & words_at({3: "jaw", 7: "Pre-Palaeolithic"})),
        plain_characters(paragraph_count(exactly=2) & contains_words(["U.S."])),
        PlainCharacters(newlines=True, extra="-(", max_run=6),
        plain_characters(char_count(exactly=12)),
    ],
    ids=repr,
)
def test_the_mask_equals_the_per_token_scan(c):
    texts = ["", "Pre", "Pre(", "jaw\n", "jaw.", "jaw. ", "PrePal", "Pre-Pa", "Pr jaw", "a ", "a. "]
    texts += ["a,", "a'", "a,'", "a\n"]
    for text in texts:  # mask = per-token check (and the trie listing of the default mask)
        scan = [c(text + t) for t in VOCAB[:-1]] + [c.accepts_end(text)]
        scan = scan if c(text) else [False] * len(VOCAB)
        fast = c.allowed_mask(MLM, text)
        assert fast.tolist() == scan == Constraint.allowed_mask(c, MLM, text).tolist(), text


def test_plain_characters_name_bad_input():
    with pytest.raises(TypeError, match="newlines"):
        PlainCharacters(newlines="no")
    with pytest.raises(ValueError, match="max_run"):
        PlainCharacters(newlines=False, max_run=0)
    with pytest.raises(TypeError, match="extra"):
        PlainCharacters(newlines=False, extra=3)
    with pytest.raises(TypeError, match="constraint"):
        plain_characters(lambda text: True)
    with pytest.raises(TypeError, match="plain"):
        word_count(exactly=3, plain="yes")


# ---------------------------------------------------------------------- the builders' default
def test_every_builder_is_plain_by_default_and_plain_false_leaves_it_out():
    c = word_count(exactly=3)
    assert isinstance(c, AllOf) and repr(c) == "word_count(exactly=3)"
    assert [repr(p) for p in c.implied_parts] == [
        repr(plain_characters(c)),
        "shape_fit(word_count(exactly=3))",  # plain characters next to the count: feasible.py
    ]
    assert not c("He ran 5") and not c.accepts_end("He ran\nfar")  # digits, newlines
    bare = word_count(exactly=3, plain=False)
    assert not isinstance(bare, AllOf) and bare("He ran 5") and bare.accepts_end("He ran\nfar")
    assert repr(bare) == "word_count(exactly=3, plain=False)"
    # one plain part per conjunction, derived from all its text constraints
    both = paragraph_count(exactly=2) & word_count(exactly=3)
    plains = [p for p in both.parts if isinstance(p, PlainCharacters)]
    assert len(plains) == 1 and "\n" in plains[0].chars  # the paragraphs allow newlines
    assert both.accepts_end("He ran.\n\nFar")
    # a conjunction of plain=False parts has none; one plain part is enough for all
    assert not any(
        isinstance(p, PlainCharacters)
        for p in (word_count(exactly=3, plain=False) & words_at({0: "He"}, plain=False)).parts
    )
    mixed = word_count(exactly=3, plain=False) & words_at({0: "He"})
    assert sum(isinstance(p, PlainCharacters) for p in mixed.parts) == 1
    # character constraints: the character set alone
    chars = char_count(exactly=5)
    assert chars("a,b.c") and not chars("a1") and chars.cheap_mask


@pytest.mark.parametrize(
    "constraint",
    [word_count(exactly=2), chars_at({2: "."}) & char_count(at_most=6), words_at({-1: "ran"})],
    ids=repr,
)
@pytest.mark.parametrize("proposal", ["mask", "lazy", "sample"])
def test_the_posterior_is_the_lm_conditioned_on_structure_and_plain_characters(
    constraint, proposal
):
    """Brute force over token sequences with the complete check of the constraint (plain
    characters included): the target the default builders define, reproduced exactly."""
    n = 4
    target, z = brute(constraint, n)
    exact = run(enumerate_exact(HardConstraint(LM, [0], constraint, proposal, n)))
    assert exact.log_ml == pytest.approx(math.log(z), abs=1e-10)
    assert exact.posterior.keys() == target.keys()
    for key, w in target.items():
        assert exact.posterior[key] == pytest.approx(w, abs=1e-10)
    assert all(constraint.accepts_end(key) for key in target)


def test_plain_characters_change_the_target():
    bare, _ = brute(word_count(exactly=2, plain=False), 4)
    plain, _ = brute(word_count(exactly=2), 4)
    assert set(plain) < set(bare) and "He ran.n" in set(bare) - set(plain)  # a glued mark
