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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llamppl.decoding.text.base import Bounds, TextStructure
from llamppl.decoding.text.counts import CharCount, CharsAt, EachCount, UnitCount
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
]


# ---------------------------------------------------------------------- builders
def char_count(
    *, exactly: int | None = None, at_least: int | None = None, at_most: int | None = None
) -> CharCount:
    """The text has ``exactly`` / ``at_least`` / ``at_most`` characters (spaces included)."""
    return CharCount(Bounds(exactly, at_least, at_most))


def word_count(
    *, exactly: int | None = None, at_least: int | None = None, at_most: int | None = None
) -> UnitCount:
    """The text has so many judge words (NLTK tokens, punctuation-only ones dropped)."""
    return UnitCount("word", Bounds(exactly, at_least, at_most))


def sentence_count(
    *, exactly: int | None = None, at_least: int | None = None, at_most: int | None = None
) -> UnitCount:
    """The text has so many sentences (Punkt, English)."""
    return UnitCount("sentence", Bounds(exactly, at_least, at_most))


def paragraph_count(
    *, exactly: int | None = None, at_least: int | None = None, at_most: int | None = None
) -> UnitCount:
    """The text has so many paragraphs (pieces between ``"\\n\\n"``)."""
    return UnitCount("paragraph", Bounds(exactly, at_least, at_most))


def chars_at(positions: Mapping[int, str]) -> CharsAt:
    """The character at each position (0-based; negative from the end) is the given one."""
    return CharsAt(positions)


def words_at(positions: Mapping[int, str]) -> UnitsAt:
    """The judge's word at each position (0-based; negative from the end) is the given one."""
    return UnitsAt("word", positions)


def chars_per_word(
    *, exactly: int | None = None, at_least: int | None = None, at_most: int | None = None
) -> EachCount:
    """Every word has so many characters (c06a: ``chars_per_word(at_most=7)``)."""
    return EachCount("word", "character", Bounds(exactly, at_least, at_most))


def words_per_sentence(
    *, exactly: int | None = None, at_least: int | None = None, at_most: int | None = None
) -> EachCount:
    """Every sentence has so many words (c10: ``words_per_sentence(at_least=10, at_most=16)``)."""
    return EachCount("sentence", "word", Bounds(exactly, at_least, at_most))


def sentences_per_paragraph(
    *, exactly: int | None = None, at_least: int | None = None, at_most: int | None = None
) -> EachCount:
    """Every paragraph has so many sentences."""
    return EachCount("paragraph", "sentence", Bounds(exactly, at_least, at_most))


def first_word_of_sentences(words: str | Sequence[str]) -> EachAt:
    """Every sentence starts with ``words`` (one word for all), or sentence ``i`` with
    ``words[i]`` (then there are exactly ``len(words)`` sentences)."""
    return EachAt("sentence", "word", 0, words)


def last_word_of_sentences(words: str | Sequence[str]) -> EachAt:
    """Every sentence ends with ``words`` (one for all), or sentence ``i`` with ``words[i]``
    (then exactly ``len(words)`` sentences; c12)."""
    return EachAt("sentence", "word", -1, words)


def last_sentence_of_paragraphs(sentences: str | Sequence[str], min_sentences: int = 0) -> EachAt:
    """Paragraph ``i`` ends with ``sentences[i]`` (exactly ``len(sentences)`` paragraphs) and
    has at least ``min_sentences`` sentences (c14: ``min_sentences=2``)."""
    if not is_integer(min_sentences) or min_sentences < 0:
        raise ValueError(f"min_sentences must be a non-negative integer, got {min_sentences!r}")
    return EachAt("paragraph", "sentence", -1, sentences, min_inner=min_sentences)


def contains_words(words: Sequence[str]) -> WordsIncluded:
    """Every word of ``words`` is among the text's words (c07)."""
    return WordsIncluded(words)


def excludes_words(words: Sequence[str]) -> WordsExcluded:
    """None of ``words`` is among the text's words (c09)."""
    return WordsExcluded(words)
