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
  the token-budget facts of :mod:`~llamppl.decoding.text.budget`; plain characters by
  default (:mod:`~llamppl.decoding.text.plain`: :class:`PlainCharacters`,
  :func:`plain_characters`), what counts imply next to positions, last words and
  required words (:mod:`~llamppl.decoding.text.joint`), and the joint check of every builder
  under plain characters (:mod:`~llamppl.decoding.text.feasible`: the prefix as a stream of
  units, :mod:`~llamppl.decoding.text.shape`, each builder an automaton on it,
  :mod:`~llamppl.decoding.text.automata`);
- :mod:`~llamppl.decoding.text.token_budget` — :func:`token_budget`, ``max_tokens`` read
  from a constraint's counts and targets;
- :mod:`~llamppl.decoding.text.collie` — :func:`from_collie` / :func:`collie_constraint`,
  COLLIE's constraint trees as these constraints.

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
    plain_characters,
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
from llamppl.decoding.text.collie import collie_constraint, from_collie
from llamppl.decoding.text.joint import CappedLastWords, RequiredWordsFit, SentenceEndsAtCap
from llamppl.decoding.text.plain import PlainCharacters
from llamppl.decoding.text.token_budget import token_budget

__all__ = [
    "BannedWords",
    "Bounds",
    "CappedLastWords",
    "CharCount",
    "CharsAt",
    "EachAt",
    "EachCount",
    "MaxWordLength",
    "PlainCharacters",
    "RegexPrefix",
    "RequiredWordsFit",
    "SentenceEndsAtCap",
    "TextStructure",
    "UnitCount",
    "UnitsAt",
    "WordsExcluded",
    "WordsIncluded",
    "banned_words",
    "char_count",
    "chars_at",
    "chars_per_word",
    "collie_constraint",
    "contains_words",
    "excludes_words",
    "first_word_of_sentences",
    "from_collie",
    "last_sentence_of_paragraphs",
    "last_word_of_sentences",
    "max_word_length",
    "paragraph_count",
    "plain_characters",
    "regex_prefix",
    "sentence_count",
    "sentences_per_paragraph",
    "token_budget",
    "word_count",
    "words_at",
    "words_per_sentence",
]
