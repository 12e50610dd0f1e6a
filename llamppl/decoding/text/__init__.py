"""Constraints on text (``llamppl.decoding.text``): characters, words, sentences, paragraphs.

- :mod:`~llamppl.decoding.text.characters` — character-level constraints with vectorised
  masks: :func:`max_word_length`, :func:`banned_words`, :func:`regex_prefix`;
- :mod:`~llamppl.decoding.text.builders` — COLLIE's text structure, exact on prefixes:
  :func:`word_count`, :func:`words_at`, :func:`last_word_of_sentences`, ... (the ``collie``
  extra: NLTK), built from :mod:`~llamppl.decoding.text.counts`,
  :mod:`~llamppl.decoding.text.positions` and :mod:`~llamppl.decoding.text.presence` over
  the prefix analysis (:mod:`~llamppl.decoding.text.units`,
  :mod:`~llamppl.decoding.text.finality`, :mod:`~llamppl.decoding.text.prefix`,
  :mod:`~llamppl.decoding.text.paragraphs`, :mod:`~llamppl.decoding.text.spelling`) and
  the token-budget facts of :mod:`~llamppl.decoding.text.budget`.

Users import them from :mod:`llamppl.constraints`::

    from llamppl.decoding.text import word_count, last_word_of_sentences
"""

from llamppl.decoding.text.builders import (
    Bounds,
    CharCount,
    CharsAt,
    EachAt,
    EachCount,
    TextStructure,
    UnitCount,
    UnitsAt,
    WordsExcluded,
    WordsIncluded,
    char_count,
    chars_at,
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
from llamppl.decoding.text.characters import (
    BannedWords,
    MaxWordLength,
    RegexPrefix,
    banned_words,
    max_word_length,
    regex_prefix,
)

__all__ = [
    "BannedWords",
    "Bounds",
    "CharCount",
    "CharsAt",
    "EachAt",
    "EachCount",
    "MaxWordLength",
    "RegexPrefix",
    "TextStructure",
    "UnitCount",
    "UnitsAt",
    "WordsExcluded",
    "WordsIncluded",
    "banned_words",
    "char_count",
    "chars_at",
    "chars_per_word",
    "contains_words",
    "excludes_words",
    "first_word_of_sentences",
    "last_sentence_of_paragraphs",
    "last_word_of_sentences",
    "max_word_length",
    "paragraph_count",
    "regex_prefix",
    "sentence_count",
    "sentences_per_paragraph",
    "word_count",
    "words_at",
    "words_per_sentence",
]
