"""Every constraint a user builds, in one place (``llamppl.constraints``).

A constraint says which texts are allowed: a prefix check ("can this still be completed?"),
a complete check ("may the text end here?") and, when it can, a batched mask of the allowed
next tokens. Programs take them: :class:`~llamppl.models.HardConstraint` conditions an LM on
any of them, exactly, with SMC. Compose them with ``&``. Every constraint and conjunction
also judges strings with no LM, as its token-level walk does: ``c.accepts_prefix(text)``
(False for a dead end) and ``c.accepts_end(text)``::

    from llamppl.constraints import word_count, last_word_of_sentences, max_word_length
    c = word_count(exactly=8) & last_word_of_sentences(["ocean"])
    c.accepts_prefix("We walked to the"), c.accepts_end("We walked down to the calm blue ocean.")

- **The protocol** — :class:`Constraint` (subclass it), :class:`PredicateConstraint` (a
  plain callable, with an optional separate complete check), :class:`AllOf` (``a & b``),
  :func:`as_constraint`, :class:`CheckTimeout` and :func:`time_bound` (every check's time
  bound).
- **Characters** — :func:`max_word_length`, :func:`banned_words`, :func:`regex_prefix`.
- **Tokenizations** — :func:`canonical` (:class:`Canonical`): the generated tokens are the
  tokenizer's own spelling of their text (canonical BPE; :mod:`llamppl.lm.bytes.canonical`);
  ``canonical(after=..., lm=lm)`` judges texts by that spelling.
- **Grammars** — :class:`Grammar` (``Grammar.from_regex``, ``Grammar.from_lark``,
  ``Grammar.from_json_schema`` with a JSON Schema or a Pydantic model class).
- **Text structure** (COLLIE; the ``collie`` extra) — counts (:func:`char_count`,
  :func:`word_count`, :func:`sentence_count`, :func:`paragraph_count`), positions
  (:func:`chars_at`, :func:`words_at`), per-unit counts (:func:`chars_per_word`,
  :func:`words_per_sentence`, :func:`sentences_per_paragraph`), words present or absent
  (:func:`contains_words`, :func:`excludes_words`) and targets per unit
  (:func:`first_word_of_sentences`, :func:`last_word_of_sentences`,
  :func:`last_sentence_of_paragraphs`).

- **Plain characters** — every text-structure builder keeps the text to plain characters by
  default (``plain=True``): :class:`PlainCharacters` (ASCII letters, spaces,
  ``. , ; : ! ? '`` with plain spacing, newlines only where paragraphs are asked for, the
  targets' own characters), one part per conjunction, derived from all its text constraints
  (:func:`plain_characters` shows it). It is part of the target: ``HardConstraint`` samples
  the LM conditioned on the structure *and* plain characters, exactly. ``plain=False`` on
  every builder of a conjunction gives the judge's constraint alone.
- **Composing text constraints** — ``&`` adds what the parts imply together (a count next
  to a position from the end, the last word of the sentences, required words:
  :mod:`llamppl.decoding.text.joint`), so ``word_count(exactly=8) &
  last_word_of_sentences(["ocean"])`` refuses ``"... with the"`` at once; the target is
  unchanged.
- **COLLIE** — :func:`collie_constraint` / :func:`from_collie` (a COLLIE constraint tree
  and its targets as these constraints) and :func:`token_budget` (``max_tokens`` from a
  constraint's counts and targets).
- **JSON** — :class:`JSONBudget`, the size budget of a JSON Schema grammar (``budget=`` of
  ``Grammar.from_json_schema``, ``GrammarConstraint`` and ``generate_json``), with the
  spelling the target fixes: numbers, and the order of an object's keys (``key_order``:
  the schema's, as ``Grammar.order_keys`` writes it, or any).
- **Databases** — :func:`sql` (:class:`SQL`): a query in SQLite's language over a
  database's own tables and columns (a grammar, compiled once per schema) that runs on it,
  read-only and time-bounded (the costly part, checked lazily); options: the tables allowed,
  whether an empty result passes, string literals that must occur in their column.
- **Chemistry** (the ``chem`` extra: ``pip install 'llamppl[chem]'``) — :func:`smiles`: the
  text is a SMILES string (a partial-SMILES prefix check closed under prefixes, and
  partialsmiles' full parse as the complete check), and :func:`open_closures`, the ring bonds and branches a prefix leaves
  open (a guide, not a bound).

The modules behind these names live in :mod:`llamppl.decoding` (by concern:
``constraints``, ``text``, ``grammar``, ``sql``); this module only gathers them.
"""

from __future__ import annotations

from llamppl.decoding.chemistry import Smiles, open_closures, smiles
from llamppl.decoding.constraints import (
    AllOf,
    CheckTimeout,
    Constraint,
    ConstraintFailure,
    PredicateConstraint,
    as_constraint,
    time_bound,
)
from llamppl.decoding.constraints.canonical import Canonical, canonical
from llamppl.decoding.grammar import CompileTimeout, Grammar
from llamppl.decoding.grammar.json_budget import JSONBudget
from llamppl.decoding.sql import SQL, sql
from llamppl.decoding.text import (
    Bounds,
    PlainCharacters,
    banned_words,
    char_count,
    chars_at,
    chars_per_word,
    collie_constraint,
    contains_words,
    excludes_words,
    first_word_of_sentences,
    from_collie,
    last_sentence_of_paragraphs,
    last_word_of_sentences,
    max_word_length,
    paragraph_count,
    plain_characters,
    regex_prefix,
    sentence_count,
    sentences_per_paragraph,
    token_budget,
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
    # tokenizations
    "Canonical",
    "canonical",
    # characters
    "banned_words",
    "max_word_length",
    "regex_prefix",
    # grammars
    "CompileTimeout",
    "Grammar",
    "JSONBudget",
    # databases
    "SQL",
    "sql",
    # chemistry
    "Smiles",
    "open_closures",
    "smiles",
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
    # plain characters
    "PlainCharacters",
    "plain_characters",
    # COLLIE
    "collie_constraint",
    "from_collie",
    "token_budget",
]
