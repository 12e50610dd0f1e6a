"""The COLLIE benchmark's own parts (``benchmarks/bench_collie.py``) that need no LM run."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("nltk")
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import collie_judge  # noqa: E402  (points NLTK_DATA at the shared Punkt data)
import collie_program  # noqa: E402
from collie_translate import translate  # noqa: E402

from llamppl import FunctionLM  # noqa: E402
from llamppl.decoding.constraints.protocol import AllOf, Constraint  # noqa: E402
from llamppl.decoding.text.builders import EachAt, UnitsAt  # noqa: E402

VOCAB = ["Pre", "-", "Pal", " jaw", ".", "\n", "(", "'s", " 'x", ",", " ,", "<eos>"]
LM = FunctionLM(VOCAB, len(VOCAB) - 1, lambda ctx: [math.sin(i + len(ctx)) for i in range(12)])


def test_plain_characters_admit_the_targets_own_characters_and_space_the_marks():
    from llamppl.decoding.text.builders import char_count, paragraph_count, word_count

    inst = {"targets": [11, ["jaw", "Pre-Palaeolithic", "II"]]}
    plain = collie_program.plain_characters(inst, word_count(exactly=11))
    assert plain.spaced_marks and {"-", "P", "I"} <= plain.chars
    assert plain("Pre-Palaeolithic jaw. Pre, jaw's.") and not plain("(jaw)")
    assert not plain("a\nb") and not plain("jaw.Pre") and not plain("jaw...")
    assert not collie_program.PlainCharacters(newlines=False)("Pre-Palaeolithic")
    glued = collie_program.plain_characters({"targets": ["U.S."]}, paragraph_count(exactly=2))
    assert not glued.spaced_marks and glued("U.S.\nPre")  # a target that glues a mark
    word = collie_program.plain_characters({"targets": [12]}, char_count(exactly=12))
    assert not word.spaced_marks and word("Celara,DEVN.")  # character constraints: no split
    assert word.max_run is None and plain.max_run == collie_program.MAX_RUN
    assert plain("a" * 20 + " jaw") and not plain("a" * 21 + " jaw")  # no endless words
    long = collie_program.plain_characters({"targets": ["x" * 25]}, word_count(exactly=3))
    assert long.max_run == 25 and long("x" * 25)  # a target's own run always fits
    assert not plain.open_marks and plain("It's the students' jaw.") and not plain("A. 'jaw")
    assert not plain("the 'jaw'") and not plain("And,'jaw") and not plain("A: ''")  # quotes
    assert plain("the jaws' Pre")  # a quote right after a letter stays
    assert not plain("jaw  Pre") and not plain("jaw , Pre") and plain("jaw, Pre")  # spacing
    loose = collie_program.plain_characters({"targets": ["a  b"]}, word_count(exactly=3))
    assert loose.open_marks and loose("a  b")  # a target's own spacing always fits
    assert not plain("A.  , jaw") and not plain("'jaw")  # no mark or quote opens a sentence
    assert word.open_marks and word("'jaw")
    assert collie_program.plain_characters({"targets": ["'Tis"]}, word_count(exactly=3)).open_marks
    capped = collie_program.PlainCharacters(newlines=True, extra="-(", max_run=6)
    for c in (plain, glued, capped, word):
        texts = [
            "",
            "Pre",
            "Pre(",
            "jaw\n",
            "jaw.",
            "jaw. ",
            "PrePal",
            "Pre-Pa",
            "Pr jaw",
            "a ",
            "a. ",
            "a,",
            "a'",
            "a,'",
            "a\n",
        ]
        for text in texts:  # mask = per-token check (and the trie listing of the default mask)
            scan = [c(text + t) for t in VOCAB[:-1]] + [c.accepts_end(text)]
            scan = scan if c(text) else [False] * len(VOCAB)
            fast = c.allowed_mask(LM, text)
            assert fast.tolist() == scan == Constraint.allowed_mask(c, LM, text).tolist(), text


def test_the_token_budget_leaves_room_for_a_sentence_around_required_words():
    from llamppl.decoding.text.builders import contains_words, word_count

    assert collie_program.token_budget(LM, word_count(exactly=11)) == 2 * 11 + 12
    room = collie_program.token_budget(LM, contains_words(["jaw"]))
    assert room >= collie_program.WORDS_PER_SENTENCE * collie_program.TOKENS_PER_WORD


@pytest.mark.skipif(not collie_judge.DATA.is_file(), reason="no shared COLLIE data")
def test_translation_keeps_the_targets_spelling_for_hints():
    """The rewrites of ``collie_translate`` rebuild position constraints from the targets as
    given (hints write ``Pre-Palaeolithic``, not its lower-cased key)."""
    instances = {(inst["key"], inst["index"]): inst for inst in collie_judge.load()}
    c05 = translate(instances["guten_c05", 46])
    (at,) = [p for p in c05.parts if isinstance(p, UnitsAt)]
    assert at.spelled == {3: "jaw", 7: "Pre-Palaeolithic", 10: "II"}
    c14 = next(translate(i) for i in instances.values() if i["structure"] == "c14")
    ends = [p for p in (c14.parts if isinstance(c14, AllOf) else (c14,)) if isinstance(p, EachAt)]
    assert ends and all(any(ch.isupper() for ch in "".join(e.spelled)) for e in ends)
