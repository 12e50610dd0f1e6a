r"""Constraints on the words, sentences and paragraphs of a text, exact on prefixes.

COLLIE (Yao et al., 2023) states constraints on a text's units — its characters, NLTK's
words and sentences, the paragraphs between blank lines — and grades with NLTK. These
constraints read the same units (:mod:`~llamppl.decoding.text.units`) and answer the
constraint protocol's questions (:mod:`~llamppl.decoding.constraints.protocol`) so that
:class:`~llamppl.models.HardConstraint` can condition a language model on them:

``c(text)`` — can the prefix still be completed into a text the judge accepts?
    Sound: never False for a prefix some continuation completes. As tight as what is
    *certain* about the prefix allows (:mod:`~llamppl.decoding.text.prefix`): a sentence
    or word that no continuation can change is checked at once, and so is the word being
    written (``"A b c Sure"`` is dead for "the 4th word is 'jaw'"). A unit that is not
    certain yet is checked a chunk or two later.
``c.accepts_end(text)`` — the judge's own verdict on the finished text.
``c.reachable(lm, text, tokens_left)`` — False when no completion of at most
    ``tokens_left`` more tokens can pass. Each builder's docstring says how the budget
    enters; the bounds use facts of ``lm``'s vocabulary (:mod:`~llamppl.decoding.text.budget`).
``c.allowed_mask(lm, text)`` — only for the character constraints (:func:`char_count`,
    :func:`chars_at`): a batched ``(V,)`` mask from per-LM tables. The others are checked
    lazily on the tokens a draw visits, in microseconds while the text is plain words and
    spaces (no NLTK call), in a millisecond or two around marks and quotes.

Builders (``exactly``/``at_least``/``at_most`` are COLLIE's ``==``/``>=``/``<=``)::

    char_count(exactly=82)                        # c04: a text of exactly 82 characters
    chars_at({3: "o", 7: "s", 10: "r"})           # c02: the 4th, 8th, 11th characters
    word_count(exactly=17) & words_at({3: "she", 7: "a", 10: "his"})           # c05
    word_count(at_least=31) & chars_per_word(at_most=7)                         # c06a
    contains_words(["not", "was", "now"])                                       # c07
    first_word_of_sentences("He")                                               # c08
    sentence_count(exactly=6) & excludes_words(["there", "of", "is"])           # c09
    sentence_count(exactly=5) & words_per_sentence(at_least=10, at_most=16)     # c10
    last_word_of_sentences(["sympathy", "republicanism", "type"])               # c12
    last_sentence_of_paragraphs([s1, s2, s3], min_sentences=2)                  # c14

Compose them with ``&``. Targets compare as COLLIE compares them: lower-cased, stripped of
punctuation at both ends (``"Peninsula."`` is ``"peninsula"``). A list of per-unit targets
fixes the number of units, as COLLIE's reduction does. Every check is a pure function of the
text, memoised, and needs the ``collie`` extra (NLTK).

Plain characters (``plain=True``, every builder's default)
    The judge splits junk into words and sentences too (``originally "Amarahah"\n\n5/15``),
    and where the split stays undecided no prefix check can refuse anything. So a builder's
    constraint also keeps the text to plain characters
    (:class:`~llamppl.decoding.text.plain.PlainCharacters`: ASCII letters, spaces,
    ``. , ; : ! ? '`` with plain spacing, newlines only where some part reads paragraphs, the
    targets' own characters, runs of at most 20 characters unless a target or
    ``chars_per_word``'s floor needs more; for character counts and positions the character
    set alone).
    It is part of what the builder means: the target of ``HardConstraint`` is the LM
    conditioned on the structure *and* plain characters, still exactly. A conjunction has
    one such part, derived from all its text constraints (:func:`plain_characters` shows
    it); a builder alone is a conjunction of one. ``plain=False`` on every builder of a
    conjunction leaves it out (the judge's constraint alone).

Composing
    ``&`` asks each part about a prefix; the conjunction adds what they imply together
    (:meth:`~llamppl.decoding.constraints.protocol.Constraint.implied`). With plain
    characters, a joint check reads every word, sentence and paragraph builder at once as an
    automaton on the stream of the prefix's units and refuses exactly the prefixes no
    continuation completes (:mod:`~llamppl.decoding.text.feasible`):
    ``sentence_count(exactly=3) & words_per_sentence(exactly=6)`` refuses ``"In a garden,
    Emily in the "`` (a seventh word must come). With or without them, counts next to
    positions, last words and required words add the pairwise parts of
    :mod:`~llamppl.decoding.text.joint`: ``word_count(exactly=8) & words_at({-1: "ocean"})``
    is as tight as ``words_at({7: "ocean"})``. The target does not change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llamppl.decoding.constraints.protocol import AllOf, Constraint
from llamppl.decoding.text.base import Bounds, TextStructure, plain_of, with_implied
from llamppl.decoding.text.counts import CharCount, CharsAt, EachCount, UnitCount
from llamppl.decoding.text.plain import PlainCharacters
from llamppl.decoding.text.positions import EachAt, UnitsAt
from llamppl.decoding.text.presence import WordsExcluded, WordsIncluded
from llamppl.validation import is_integer

__all__ = [
    "Bounds",
    "TextStructure",
    "CharCount",
    "CharsAt",
    "UnitCount",
    "UnitsAt",
    "EachCount",
    "EachAt",
    "WordsIncluded",
    "WordsExcluded",
    "char_count",
    "word_count",
    "sentence_count",
    "paragraph_count",
    "chars_at",
    "words_at",
    "chars_per_word",
    "words_per_sentence",
    "sentences_per_paragraph",
    "first_word_of_sentences",
    "last_word_of_sentences",
    "last_sentence_of_paragraphs",
    "contains_words",
    "excludes_words",
    "plain_characters",
]


# ---------------------------------------------------------------------- builders
def char_count(
    *,
    exactly: int | None = None,
    at_least: int | None = None,
    at_most: int | None = None,
    plain: bool = True,
) -> Constraint:
    """The text has ``exactly`` / ``at_least`` / ``at_most`` characters (spaces included).

    ``plain``: keep to plain characters too (module docstring; default on); for a text
    counted in characters, which needs no word split, that is the character set alone (no
    spacing rules, no cap on runs).
    """
    return with_implied(CharCount(Bounds(exactly, at_least, at_most), plain=plain))


def word_count(
    *,
    exactly: int | None = None,
    at_least: int | None = None,
    at_most: int | None = None,
    plain: bool = True,
) -> Constraint:
    """The text has so many judge words (NLTK tokens, punctuation-only ones dropped).

    ``plain``: keep to plain characters too (module docstring; default on).
    """
    return with_implied(UnitCount("word", Bounds(exactly, at_least, at_most), plain=plain))


def sentence_count(
    *,
    exactly: int | None = None,
    at_least: int | None = None,
    at_most: int | None = None,
    plain: bool = True,
) -> Constraint:
    """The text has so many sentences (Punkt, English).

    ``plain``: keep to plain characters too (module docstring; default on).
    """
    return with_implied(UnitCount("sentence", Bounds(exactly, at_least, at_most), plain=plain))


def paragraph_count(
    *,
    exactly: int | None = None,
    at_least: int | None = None,
    at_most: int | None = None,
    plain: bool = True,
) -> Constraint:
    """The text has so many paragraphs (pieces between ``"\\n\\n"``).

    ``plain``: keep to plain characters too (module docstring; default on).
    """
    return with_implied(UnitCount("paragraph", Bounds(exactly, at_least, at_most), plain=plain))


def chars_at(positions: Mapping[int, str], *, plain: bool = True) -> Constraint:
    """The character at each position (0-based; negative from the end) is the given one.

    ``plain``: keep to plain characters too (module docstring; default on); the character set
    alone, as for :func:`char_count`.
    """
    return with_implied(CharsAt(positions, plain=plain))


def words_at(positions: Mapping[int, str], *, plain: bool = True) -> Constraint:
    """The judge's word at each position (0-based; negative from the end) is the given one.

    ``plain``: keep to plain characters too (module docstring; default on).
    """
    return with_implied(UnitsAt("word", positions, plain=plain))


def chars_per_word(
    *,
    exactly: int | None = None,
    at_least: int | None = None,
    at_most: int | None = None,
    plain: bool = True,
) -> Constraint:
    """Every word has so many characters (c06a: ``chars_per_word(at_most=7)``).

    ``plain``: keep to plain characters too (module docstring; default on).
    """
    return with_implied(
        EachCount("word", "character", Bounds(exactly, at_least, at_most), plain=plain)
    )


def words_per_sentence(
    *,
    exactly: int | None = None,
    at_least: int | None = None,
    at_most: int | None = None,
    plain: bool = True,
) -> Constraint:
    """Every sentence has so many words (c10: ``words_per_sentence(at_least=10, at_most=16)``).

    ``plain``: keep to plain characters too (module docstring; default on).
    """
    return with_implied(
        EachCount("sentence", "word", Bounds(exactly, at_least, at_most), plain=plain)
    )


def sentences_per_paragraph(
    *,
    exactly: int | None = None,
    at_least: int | None = None,
    at_most: int | None = None,
    plain: bool = True,
) -> Constraint:
    """Every paragraph has so many sentences.

    ``plain``: keep to plain characters too (module docstring; default on).
    """
    return with_implied(
        EachCount("paragraph", "sentence", Bounds(exactly, at_least, at_most), plain=plain)
    )


def first_word_of_sentences(words: str | Sequence[str], *, plain: bool = True) -> Constraint:
    """Every sentence starts with ``words`` (one word for all), or sentence ``i`` with
    ``words[i]`` (then there are exactly ``len(words)`` sentences).
    ``plain``: keep to plain characters too (module docstring; default on).
    """
    return with_implied(EachAt("sentence", "word", 0, words, plain=plain))


def last_word_of_sentences(words: str | Sequence[str], *, plain: bool = True) -> Constraint:
    """Every sentence ends with ``words`` (one for all), or sentence ``i`` with ``words[i]``
    (then exactly ``len(words)`` sentences; c12).
    ``plain``: keep to plain characters too (module docstring; default on).
    """
    return with_implied(EachAt("sentence", "word", -1, words, plain=plain))


def last_sentence_of_paragraphs(
    sentences: str | Sequence[str], min_sentences: int = 0, *, plain: bool = True
) -> Constraint:
    """Paragraph ``i`` ends with ``sentences[i]`` (exactly ``len(sentences)`` paragraphs) and
    has at least ``min_sentences`` sentences (c14: ``min_sentences=2``).
    ``plain``: keep to plain characters too (module docstring; default on).
    """
    if not is_integer(min_sentences) or min_sentences < 0:
        raise ValueError(f"min_sentences must be a non-negative integer, got {min_sentences!r}")
    return with_implied(
        EachAt("paragraph", "sentence", -1, sentences, min_inner=min_sentences, plain=plain)
    )


def contains_words(words: Sequence[str], *, plain: bool = True) -> Constraint:
    """Every word of ``words`` is among the text's words (c07).

    ``plain``: keep to plain characters too (module docstring; default on).
    """
    return with_implied(WordsIncluded(words, plain=plain))


def excludes_words(words: Sequence[str], *, plain: bool = True) -> Constraint:
    """None of ``words`` is among the text's words (c09).

    ``plain``: keep to plain characters too (module docstring; default on).
    """
    return with_implied(WordsExcluded(words, plain=plain))


def plain_characters(constraint: Constraint) -> PlainCharacters:
    """The plain characters the text constraints of ``constraint`` ask for by default (the
    :class:`~llamppl.decoding.text.plain.PlainCharacters` part a conjunction of them carries),
    derived from every text constraint in it whatever their ``plain`` flags: the targets'
    characters, newlines where some part reads paragraphs, the character set alone where
    some part is on characters. Add it yourself to a conjunction of ``plain=False`` parts,
    or to a constraint of your own (``my_check & plain_characters(word_count(exactly=8))``).
    """
    if not isinstance(constraint, Constraint):
        raise TypeError(f"constraint must be a Constraint, got {type(constraint).__name__}")
    parts = constraint.given if isinstance(constraint, AllOf) else (constraint,)
    return plain_of(parts)
