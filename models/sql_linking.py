"""Schema linking: the tables a question names, for :func:`~llamppl.models.text_to_sql`.

A small LM given every table of a database often reads the wrong one (``How many airports
do we have?`` answered from ``flights``). :func:`link_tables` keeps the tables the question
names, and the tables that join them:

1. a table whose name has a word in the question (words split at ``_``, case changes and
   digits, compared in lower case with a plural ``s``/``es``/``ies`` removed, words of two
   letters or fewer and generic words such as ``id``, ``name``, ``number`` ignored);
2. a table with a column whose words are all in the question, when those words belong to
   that column alone in the schema (``horsepower``, ``song release year``);
3. the tables on a shortest path of foreign keys between any two tables found (the table
   ``has_pet`` between ``student`` and ``pets``).

When no table is found, every table is kept. The program restricts the constraint and the
prompt's schema to the linked tables (``tables="linked"``): a choice of the program, made
before any sampling, so the target is the LM conditioned on a query over those tables::

    from llamppl.models.sql_linking import link_tables
    link_tables(schema, "How many pets does each student have?")   # ('Student', 'Has_Pet', 'Pets')
"""

from __future__ import annotations

import itertools
import re
from collections import Counter, defaultdict

from llamppl.decoding.sql.database import Schema

__all__ = ["link_tables", "question_words"]

_GENERIC = frozenset(
    "id ids name names the of and in on at to by for with is are was were what which who how "
    "many much all each every list show give find return number count code type".split()
)


def _split(text: str) -> list[str]:
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    return [w.lower() for w in re.findall(r"[A-Za-z]+|[0-9]+", spaced)]


def _stem(word: str) -> str:
    for suffix, repl in (("ies", "y"), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)] + repl
    return word


def question_words(text: str) -> frozenset[str]:
    """The words of ``text``, lower-cased, a plural ending removed."""
    return frozenset(_stem(w) for w in _split(text))


def _name_words(name: str) -> list[str]:
    return [_stem(w) for w in _split(name) if len(w) > 2 and w not in _GENERIC]


def link_tables(schema: Schema, question: str) -> tuple[str, ...]:
    """The tables of ``schema`` the question names and the tables joining them (module
    docstring), in the schema's order; every table when it names none."""
    if not isinstance(schema, Schema):
        raise TypeError(f"schema must be a Schema, got {type(schema).__name__}")
    if not isinstance(question, str):
        raise TypeError(f"question must be a str, got {type(question).__name__}")
    said = question_words(question)
    owners = Counter(w for t in schema.tables for c in t.columns for w in set(_name_words(c.name)))
    found: set[str] = set()
    for t in schema.tables:
        if any(w in said for w in _name_words(t.name)):
            found.add(t.name.lower())
        for c in t.columns:
            words = _name_words(c.name)
            if words and all(w in said and owners[w] == 1 for w in words):
                found.add(t.name.lower())
    if not found:
        return tuple(t.name for t in schema.tables)
    graph: dict[str, set[str]] = defaultdict(set)
    for t in schema.tables:
        for c in t.columns:
            if c.references is not None:
                a, b = t.name.lower(), c.references[0].lower()
                graph[a].add(b)
                graph[b].add(a)
    linked = set(found)
    for a, b in itertools.combinations(sorted(found), 2):
        linked |= _path(graph, a, b)
    return tuple(t.name for t in schema.tables if t.name.lower() in linked)


def _path(graph: dict[str, set[str]], a: str, b: str) -> set[str]:
    """The tables on a shortest path from ``a`` to ``b`` (empty when none)."""
    before: dict[str, str | None] = {a: None}
    frontier = [a]
    while frontier and b not in before:
        nxt = []
        for u in frontier:
            for v in sorted(graph[u]):
                if v not in before:
                    before[v] = u
                    nxt.append(v)
        frontier = nxt
    if b not in before:
        return set()
    out, node = set(), b
    while node is not None:
        out.add(node)
        node = before[node]
    return out
