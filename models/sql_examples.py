"""Worked examples chosen for a question: the questions of *other* databases most like it.

A small LM copies the shape of a worked example far better than it follows an instruction:
``How many flights do we have?`` after the example ``How many airports do we have? →
SELECT count(*) FROM airports`` is an easy copy. :func:`nearest_examples` picks, from a pool
of examples over other databases, the ``k`` whose questions are most like the question asked,
once the words that belong to one database are masked (the question's *template*; the idea of
masked-question similarity of DAIL-SQL, Gao et al. 2023):

1. each question is split into lower-case words (a plural ending removed,
   :func:`~llamppl.models.sql_linking.question_words`); a number becomes ``<n>``, a quoted
   value ``<v>``, and a word that names a table or column of the question's own database
   ``<s>``;
2. the similarity of two questions is the Jaccard index of their sets of masked words and
   masked word pairs (bigrams), so word order counts a little;
3. the ``k`` most similar examples are kept, at most ``per_db`` from any one database (the
   prompt then shows several schemas), and are shown most similar *last*, nearest the
   question.

The examples' own databases are never the one asked about: the pool is the user's (for
instance, questions already answered over their other databases), and :class:`SQLExample`
carries the ``CREATE TABLE`` text of the tables its query reads::

    from llamppl.models.sql_examples import nearest_examples
    shots = nearest_examples("How many flights are there?", pool, k=3, schema=db.schema)
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from llamppl.decoding.sql.database import Schema
from llamppl.validation import check_nonnegative_int, check_positive_int

from .sql_linking import question_words
from .sql_prompt import SQLExample

__all__ = ["declared_names", "masked_words", "nearest_examples", "similarity"]

_QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'|``.*?''|`[^`]*`")
_WORD = re.compile(r"<[nvs]>|[A-Za-z]+|[0-9]+(?:\.[0-9]+)?")


def _schema_words(schema: Schema | str | None) -> frozenset[str]:
    if schema is None:
        return frozenset()
    if isinstance(schema, str):
        names = list(declared_names(schema))
    else:
        names = [t.name for t in schema.tables]
        names += [c.name for t in schema.tables for c in t.columns]
    return frozenset().union(*(question_words(n) for n in names)) if names else frozenset()


def masked_words(question: str, schema: Schema | str | None = None) -> tuple[str, ...]:
    """The question's words in order, lower-case, plural endings removed, with quoted values
    as ``<v>``, numbers as ``<n>`` and words naming ``schema``'s tables or columns as ``<s>``
    (module docstring, step 1); ``schema`` is a :class:`Schema` or ``CREATE TABLE`` text."""
    if not isinstance(question, str):
        raise TypeError(f"question must be a str, got {type(question).__name__}")
    own = _schema_words(schema)
    out: list[str] = []
    for w in _WORD.findall(_QUOTED.sub(" <v> ", question)):
        if w in ("<v>", "<n>", "<s>"):
            out.append(w)
        elif w[0].isdigit():
            out.append("<n>")
        else:
            stem = next(iter(question_words(w)), w.lower())
            out.append("<s>" if stem in own else stem)
    return tuple(out)


def _features(words: tuple[str, ...]) -> frozenset:
    return frozenset(words) | frozenset(zip(words, words[1:]))


def similarity(a: tuple[str, ...], b: tuple[str, ...]) -> float:
    """The Jaccard index of the masked words and word pairs of two questions (step 2)."""
    fa, fb = _features(a), _features(b)
    return len(fa & fb) / len(fa | fb) if fa or fb else 0.0


def nearest_examples(
    question: str,
    pool: Sequence[SQLExample],
    k: int = 3,
    *,
    schema: Schema | None = None,
    per_db: int = 2,
) -> list[SQLExample]:
    """The ``k`` examples of ``pool`` most like ``question`` (module docstring), least similar
    first; at most ``per_db`` from one database (examples with the same ``schema`` text), and
    never two with the same query (paraphrases).

    ``schema`` is the question's own database (its names are masked in the question); each
    example's names are masked with the tables its own ``schema`` text declares."""
    k = check_nonnegative_int("k", k)
    per_db = check_positive_int("per_db", per_db)
    if isinstance(pool, SQLExample) or not all(isinstance(e, SQLExample) for e in pool):
        raise TypeError("pool must be a sequence of SQLExample")
    target = masked_words(question, schema)
    scored = []
    for i, ex in enumerate(pool):
        words = masked_words(ex.question, ex.schema)
        scored.append((-similarity(target, words), i, ex))
    scored.sort(key=lambda s: (s[0], s[1]))
    chosen: list[SQLExample] = []
    used: dict[str, int] = {}
    for _, _, ex in scored:
        if len(chosen) == k:
            break
        if used.get(ex.schema, 0) < per_db and all(c.sql != ex.sql for c in chosen):
            chosen.append(ex)
            used[ex.schema] = used.get(ex.schema, 0) + 1
    return chosen[::-1]


_DECLARED = re.compile(r"CREATE (?:TABLE|VIEW) (\"[^\"]+\"|\S+) \((.*)\);")


def declared_names(schema_text: str) -> tuple[str, ...]:
    """The table and column names ``CREATE TABLE`` text declares (an example's schema)."""
    names: list[str] = []
    for line in schema_text.splitlines():
        m = _DECLARED.match(line.strip())
        if not m:
            continue
        names.append(m.group(1).strip('"'))
        for part in m.group(2).split(","):
            part = part.strip()
            if part and not part.startswith("PRIMARY KEY"):
                names.append(part.split(" ")[0].strip('"'))
    return tuple(names)
