"""Every constraint a user builds, in one place (``llamppl.constraints``).

A constraint says which texts are allowed: a prefix check ("can this still be completed?"),
a complete check ("may the text end here?") and, when it can, a batched mask of the allowed
next tokens. Programs take them: :class:`~llamppl.models.HardConstraint` conditions an LM on
any of them, exactly, with SMC. Compose them with ``&``::

    from llamppl.constraints import word_count, last_word_of_sentences, max_word_length
    c = word_count(exactly=8) & last_word_of_sentences(["ocean"])

- **The protocol** — :class:`Constraint` (subclass it), :class:`PredicateConstraint` (a
  plain callable, with an optional separate complete check), :class:`AllOf` (``a & b``),
  :func:`as_constraint`, :class:`CheckTimeout` and :func:`time_bound` (every check's time
  bound).
- **Characters** — :func:`max_word_length`, :func:`banned_words`, :func:`regex_prefix`.
- **Grammars** — :class:`Grammar` (``Grammar.from_regex``, ``Grammar.from_lark``,
  ``Grammar.from_json_schema`` with a JSON Schema or a Pydantic model class).
- **Text structure** (COLLIE; the ``collie`` extra) — counts (:func:`char_count`,
  :func:`word_count`, :func:`sentence_count`, :func:`paragraph_count`), positions
  (:func:`chars_at`, :func:`words_at`), per-unit counts (:func:`chars_per_word`,
  :func:`words_per_sentence`, :func:`sentences_per_paragraph`), words present or absent
  (:func:`contains_words`, :func:`excludes_words`) and targets per unit
  (:func:`first_word_of_sentences`, :func:`last_word_of_sentences`,
  :func:`last_sentence_of_paragraphs`).

The modules behind these names live in :mod:`llamppl.decoding` (by concern:
``constraints``, ``text``, ``grammar``); this module only gathers them.
"""

from __future__ import annotations

from llamppl.decoding.constraints import (
    AllOf,
    CheckTimeout,
    Constraint,
    ConstraintFailure,
    PredicateConstraint,
    as_constraint,
    time_bound,
)
from llamppl.decoding.grammar import CompileTimeout, Grammar
from llamppl.decoding.text import (
    Bounds,
    banned_words,
    char_count,
    chars_at,
    chars_per_word,
    contains_words,
    excludes_words,
    first_word_of_sentences,
    last_sentence_of_paragraphs,
    last_word_of_sentences,
    max_word_length,
    paragraph_count,
    regex_prefix,
    sentence_count,
    sentences_per_paragraph,
    word_count,
    words_at,
    words_per_sentence,
)

__all__ = [
    # the protocol
    "AllOf",
    "CheckTimeout",
    "Constraint",
    "ConstraintFailure",
    "PredicateConstraint",
    "as_constraint",
    "time_bound",
    # characters
    "banned_words",
    "max_word_length",
    "regex_prefix",
    # grammars
    "CompileTimeout",
    "Grammar",
    # text structure
    "Bounds",
    "char_count",
    "chars_at",
    "chars_per_word",
    "contains_words",
    "excludes_words",
    "first_word_of_sentences",
    "last_sentence_of_paragraphs",
    "last_word_of_sentences",
    "paragraph_count",
    "sentence_count",
    "sentences_per_paragraph",
    "word_count",
    "words_at",
    "words_per_sentence",
]
