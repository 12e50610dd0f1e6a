"""The costly part of the SQL constraint: checks that ask the database, on the text.

:class:`QueryCheck` is a text constraint (:class:`~llamppl.decoding.constraints.protocol.Constraint`)
without a cheap mask, so :class:`~llamppl.models.HardConstraint` checks it lazily, on the
tokens its proposal draws (:mod:`~llamppl.decoding.proposals.lazy`), after the grammar's
mask (:mod:`~llamppl.decoding.sql.grammar`) has removed everything else.

**Complete check** (``accepts_end``, asked only when an end token is drawn): the query
(a final ``;`` and whitespace dropped) runs on the database (:class:`~llamppl.decoding.sql.
execute.Executor`: read-only, one statement, time-bounded, :class:`~llamppl.decoding.
constraints.time_bound.CheckTimeout` past the bound); with ``allow_empty=False`` its result
has a row with a value that is not NULL; with ``values=True`` every string literal compared to
a column occurs in it (:mod:`~llamppl.decoding.sql.values`).

**Prefix check** (``__call__``), closed under prefixes (a text it rejects has no accepted
extension, so the lazy draw may list the allowed tokens on the vocabulary's trie):

1. *clauses that cannot run:* at parenthesis depth 0, a word that begins with a clause
   keyword (``WHERE GROUP HAVING ORDER LIMIT UNION INTERSECT EXCEPT``) right after the end
   of an operand (a name, number, string, ``)`` or ``NULL``/``END``/``ASC``/``DESC``/...)
   ends the query's clauses before it: the text before it must compile (SQLite's
   ``EXPLAIN``, nothing run). ``SELECT name FROM pets WHERE`` is refused when ``pets``
   has no column ``name``: no completion can run. (The grammar gives aliases no word that
   begins with such a keyword, so the word is that keyword, maybe with more letters glued
   on, which SQLite would not read as a query either.)
2. *names in scope:* once a query's ``FROM`` is written, its words must name something it
   can use, and the columns of its later clauses must be in the tables it reads
   (:mod:`~llamppl.decoding.sql.scope`);
3. *a final ``;``:* only whitespace may follow it, so the text before it must pass the
   complete check;
4. *values* (``values=True``): every string literal compared to a column occurs in it, and
   one still being written begins like one of the column's values;
5. *literals from the question* (``literals=text``): every literal comes from the text
   (:mod:`~llamppl.decoding.sql.literals`).

Answers are kept per text (and per compiled clause), so particles cloned at resampling do
not ask again; ``runs`` counts the statements sent to SQLite::

    check = QueryCheck(executor, schema, allow_empty=False, values=True)
    check("SELECT name FROM singer WHERE country = 'Fr")   # True if a country begins "Fr"
"""

from __future__ import annotations

from llamppl.decoding.constraints.protocol import Constraint
from llamppl.decoding.sql.database import Schema
from llamppl.decoding.sql.execute import Executor, Run
from llamppl.decoding.sql.grammar import grammar_words
from llamppl.decoding.sql.lexer import CLAUSE_KEYWORDS, OPERAND_KEYWORDS, Token, is_keyword, tokens
from llamppl.decoding.sql.literals import Mentioned, literal_error
from llamppl.decoding.sql.scope import Names, scope_error
from llamppl.decoding.sql.values import Values, is_string_literal, literal_comparisons
from llamppl.lm.memo import LRU

__all__ = ["QueryCheck", "clause_cuts", "query_text"]

_MEMO = 4096


def query_text(text: str) -> str:
    """The statement of a complete text: whitespace and one final ``;`` removed."""
    body = text.strip()
    return body[:-1].rstrip() if body.endswith(";") else body


def _ends_operand(tok: Token) -> bool:
    if tok.kind in ("number", "string", "quoted"):
        return True
    if tok.kind == "punct":
        return tok.text == ")"
    return not is_keyword(tok.text) or tok.upper in OPERAND_KEYWORDS


def clause_cuts(toks: list[Token]) -> list[int]:
    """Offsets in the text where a clause keyword begins at depth 0 after an operand (rule 1
    of the module docstring): the text before each must compile."""
    out = []
    for prev, tok in zip(toks, toks[1:]):
        if tok.depth or tok.kind != "word" or not _ends_operand(prev):
            continue
        if any(tok.upper.startswith(k) for k in CLAUSE_KEYWORDS):
            out.append(tok.start)
    return out


class QueryCheck(Constraint):
    """The database's checks of a query text (module docstring).

    Parameters
    ----------
    executor : Executor
        Runs statements on the read-only database.
    schema : Schema
        The database's tables (the value check resolves column names with it).
    allow_empty : bool
        Whether a result without a row (or with only NULL values) passes.
    values : bool
        Whether string literals compared to a column must occur in it.
    literals : str | None
        A text (the question) the query's literals must be taken from
        (:mod:`~llamppl.decoding.sql.literals`); None: any literal.
    """

    prefix_closed = True

    def __init__(
        self,
        executor: Executor,
        schema: Schema,
        *,
        allow_empty: bool = True,
        values: bool = False,
        literals: str | None = None,
    ) -> None:
        self.executor, self.schema = executor, schema
        self.allow_empty, self.values = bool(allow_empty), bool(values)
        self.literals = literals
        self.mentioned = None if literals is None else Mentioned.of(literals)
        stated = None if self.mentioned is None else self.mentioned.text
        self.value_index = Values(schema, executor, stated) if values else None
        self.names = Names.of(schema, grammar_words())
        self.known = self.names.known
        self._prefix: LRU = LRU(_MEMO)
        self._end: LRU = LRU(_MEMO)
        self._compiled: LRU = LRU(_MEMO)
        self._runs: LRU = LRU(_MEMO)

    @property
    def runs(self) -> int:
        """Statements sent to SQLite so far (runs, compilations and value look-ups)."""
        return self.executor.runs

    # ------------------------------------------------------------ the database's answers
    def run(self, text: str) -> Run:
        """The :class:`~llamppl.decoding.sql.execute.Run` of a complete text (kept per query)."""
        query = query_text(text)
        found = self._runs.get(query)
        if found is None:
            found = self.executor.run(query)
            self._runs.put(query, found)
        return found

    def compile_error(self, text: str) -> str | None:
        """SQLite's message when ``text`` does not compile (None when it does; kept)."""
        key = text.strip()
        found = self._compiled.get(key)
        if found is None:
            found = (self.executor.prepare(key) or "",)
            self._compiled.put(key, found)
        return found[0] or None

    def failure(self, text: str) -> str | None:
        """Why the complete text may not end here, or None when it passes."""
        run = self.run(text)
        if not run.ok:
            return f"the query does not run: {run.error}"
        if not self.allow_empty and not any(v is not None for row in run.rows for v in row):
            return "the query's result is empty"
        toks = tokens(query_text(text))
        if self.mentioned is not None:
            error = literal_error(toks, self.mentioned, self._strings(toks))
            if error is not None:
                return error
        if self.value_index is not None:
            for c in literal_comparisons(toks, self.schema, complete=True):
                if not self.value_index.ok(c):
                    return f"no value {c.literal!r} in column {c.column}"
        return None

    def _strings(self, toks: list[Token]) -> list[int]:
        return [i for i, t in enumerate(toks) if is_string_literal(t, self.schema)]

    # ------------------------------------------------------------ the text constraint
    def accepts_end(self, text: str) -> bool:
        found = self._end.get(text)
        if found is None:
            found = self.failure(text) is None
            self._end.put(text, found)
        return found

    def __call__(self, text: str) -> bool:
        found = self._prefix.get(text)
        if found is None:
            found = self._prefix_ok(text)
            self._prefix.put(text, found)
        return found

    def _prefix_ok(self, text: str) -> bool:
        toks = tokens(text)
        ends = [i for i, t in enumerate(toks) if t.text == ";" and t.depth == 0]
        if ends:  # only whitespace may follow a final ";"
            if ends[0] != len(toks) - 1:
                return False
            return self.accepts_end(text)
        if scope_error(toks, self.names, self.known) is not None:
            return False
        if self.mentioned is not None and literal_error(toks, self.mentioned, self._strings(toks)):
            return False
        for cut in clause_cuts(toks):
            if self.compile_error(text[:cut]) is not None:
                return False
        if self.value_index is not None:
            return all(self.value_index.ok(c) for c in literal_comparisons(toks, self.schema))
        return True

    def __repr__(self) -> str:
        literals = "" if self.literals is None else f", literals={self.literals!r}"
        return f"QueryCheck(allow_empty={self.allow_empty}, values={self.values}{literals})"
