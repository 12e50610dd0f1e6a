"""The grammar of SQLite queries over one database's tables and columns (llguidance Lark).

:func:`sql_lark` writes a Lark grammar (llguidance's dialect) of SQLite's ``SELECT``
statement in which every table and column name is one of the database's own, and
:func:`sql_grammar` compiles it once per distinct grammar text (a cache: a database read
twice, or two files with the same schema, share one compiled grammar and its matchers),
so a mask costs what any grammar's mask costs.

The language: ``SELECT [DISTINCT|ALL] result-columns [FROM joins] [WHERE e] [GROUP BY e, ...
[HAVING e]]`` cores joined by ``UNION [ALL]``, ``INTERSECT`` or ``EXCEPT``, then ``[ORDER
BY e [ASC|DESC], ...] [LIMIT e [OFFSET e]]``, and one optional final ``;``. Joins: ``,``,
``[NATURAL] [LEFT [OUTER]|INNER|CROSS] JOIN`` with ``ON e`` or ``USING (c, ...)``; tables and
subqueries in ``FROM`` with optional aliases. Expressions: ``OR``, ``AND``, ``NOT``,
comparisons (``= == != <> < <= > >=``), ``IS [NOT]``, ``[NOT] LIKE|GLOB``, ``[NOT] BETWEEN``,
``[NOT] IN (list | query)``, ``ISNULL|NOTNULL|NOT NULL``, ``+ - * / % ||``, unary ``- +``,
parentheses, scalar subqueries, ``EXISTS``, ``CASE``, ``CAST``, aggregates (``count(*)``,
``count|sum|avg|min|max|total|group_concat([DISTINCT] e)``) and SQLite's safe scalar
functions (:data:`~llamppl.decoding.sql.execute.SAFE_FUNCTIONS`), numbers, ``'...'`` and
``"..."`` strings (on one line), ``NULL``, ``TRUE``/``FALSE`` and ``CURRENT_DATE``/``TIME``/
``TIMESTAMP``.

Names are matched as SQLite matches them: ASCII case ignored, bare when the name is a plain
identifier, and quoted as ``"name"``, `` `name` `` or ``[name]`` always. A column may be
qualified (``t.c``, ``T1.c``) by a table name or an alias. A result column's alias needs
``AS`` (``SELECT name AS n``; ``SELECT name n`` is not in the language: a small LM that
copies ``Title TEXT`` from a ``CREATE TABLE`` would otherwise be writing an alias); a
table's may leave it out (``FROM singer T1``). Aliases are free identifiers,
except SQL's reserved words and words that begin with a clause keyword (``WHERE``, ``GROUP``,
``HAVING``, ``ORDER``, ``LIMIT``, ``UNION``, ``INTERSECT``, ``EXCEPT``: an alias ``Orders``
is not in the language, so such a word after a table is always the clause keyword, which
the prefix check of :mod:`~llamppl.decoding.sql.checks` relies on). Keywords ignore case;
whitespace (spaces, tabs, newlines) may stand between any two tokens; comments are not in
the language.

The grammar is a superset of what runs (a column of another table, ``SELECTname`` without
the space): the complete check runs the query, and the prefix check prepares a query's
first clauses as soon as a clause keyword follows them (:mod:`~llamppl.decoding.sql.checks`)::

    from llamppl.decoding.sql.grammar import sql_grammar
    grammar = sql_grammar(schema)          # a llamppl Grammar (cheap mask)
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict

from llamppl.decoding.grammar.compile import Grammar
from llamppl.decoding.sql.database import Schema
from llamppl.decoding.sql.lexer import CLAUSE_KEYWORDS, RESERVED

__all__ = [
    "CLAUSE_KEYWORDS",
    "RESERVED",
    "grammar_words",
    "identifier_forms",
    "sql_grammar",
    "sql_lark",
]

_AGGREGATES = ("count", "sum", "avg", "min", "max", "total")
_SCALARS = (
    "abs lower upper length substr substring round coalesce ifnull nullif instr trim ltrim "
    "rtrim replace date time datetime julianday strftime typeof iif sign min max"
).split()
_TYPES = ("integer", "int", "real", "text", "numeric", "float", "double", "blob", "varchar")
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")

_CORE = r"""
start: _SP? query (_SP? ";")? _SP?
query: select_core (_SP compound_op _SP select_core){0,3} (_SP order_by)? (_SP limit)?
compound_op: "union"i (_SP "all"i)? | "intersect"i | "except"i
select_core: "select"i (_SP ("distinct"i | "all"i))? _SP result_column (_SP? "," _SP? result_column){0,7} (_SP from_clause)? (_SP where_clause)? (_SP group_by)?
result_column: "*" | qualifier "." "*" | expr (_SP "as"i _SP alias)?
from_clause: "from"i _SP source join{0,5}
join: _SP? "," _SP? source | _SP join_op _SP source (_SP join_constraint)?
join_op: ("natural"i _SP)? (("left"i (_SP "outer"i)? | "inner"i | "cross"i) _SP)? "join"i
join_constraint: "on"i _SP expr | "using"i _SP? "(" _SP? column (_SP? "," _SP? column)* _SP? ")"
source: table (_SP ("as"i _SP)? TABLE_ALIAS)? | "(" _SP? query _SP? ")" (_SP? ("as"i _SP)? TABLE_ALIAS)?
where_clause: "where"i _SP expr
group_by: "group"i _SP "by"i _SP expr (_SP? "," _SP? expr){0,4} (_SP "having"i _SP expr)?
order_by: "order"i _SP "by"i _SP ordering (_SP? "," _SP? ordering){0,4}
ordering: expr (_SP ("asc"i | "desc"i))?
limit: "limit"i _SP INTEGER ((_SP "offset"i _SP | _SP? "," _SP?) INTEGER)?

expr: conjunction (_SP "or"i _SP conjunction){0,3}
conjunction: negation (_SP "and"i _SP negation){0,3}
negation: "not"i _SP negation | predicate
predicate: sum
    | sum _SP? comparison _SP? sum
    | sum _SP "is"i (_SP "not"i)? _SP sum
    | sum (_SP "not"i)? _SP ("like"i | "glob"i) _SP sum
    | sum (_SP "not"i)? _SP "between"i _SP sum _SP "and"i _SP sum
    | sum (_SP "not"i)? _SP "in"i _SP? "(" _SP? (query | expr (_SP? "," _SP? expr){0,19})? _SP? ")"
    | sum _SP ("isnull"i | "notnull"i | "not"i _SP "null"i)
comparison: "=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">="
sum: product (_SP? ("+" | "||") _SP? product | _SP? "-" (_SP product | product_unsigned)){0,3}
product: unary (_SP? ("*" | "/" | "%") _SP? unary){0,3}
product_unsigned: primary (_SP? ("*" | "/" | "%") _SP? unary){0,3}
unary: ("-" | "+") _SP? primary | primary
primary: literal
    | column_ref
    | function
    | "(" _SP? expr _SP? ")"
    | "(" _SP? query _SP? ")"
    | "exists"i _SP? "(" _SP? query _SP? ")"
    | "case"i (_SP expr)? (_SP "when"i _SP expr _SP "then"i _SP expr)+ (_SP "else"i _SP expr)? _SP "end"i
    | "cast"i _SP? "(" _SP? expr _SP "as"i _SP type_name _SP? ")"
column_ref: column | qualifier "." column
qualifier: table | TABLE_ALIAS
alias: ALIAS | QUOTED_ALIAS
function: "count"i _SP? "(" _SP? "*" _SP? ")"
    | aggregate _SP? "(" _SP? ("distinct"i _SP)? expr _SP? ")"
    | "group_concat"i _SP? "(" _SP? ("distinct"i _SP)? expr (_SP? "," _SP? expr)? _SP? ")"
    | scalar _SP? "(" _SP? (expr (_SP? "," _SP? expr)*)? _SP? ")"
literal: NUMBER | STRING | DQ_STRING | "null"i | "true"i | "false"i
    | "current_date"i | "current_time"i | "current_timestamp"i

INTEGER: /[0-9]{1,9}/
NUMBER: /[0-9]{1,12}(\.[0-9]{0,8})?([eE][+-]?[0-9]{1,3})?/ | /\.[0-9]{1,8}([eE][+-]?[0-9]{1,3})?/
STRING: /'([^'\n]|''){0,100}'/
DQ_STRING: /"([^"\n]|""){0,100}"/
QUOTED_ALIAS: /"([^"\n]|""){1,30}"/
"""


def grammar_words() -> frozenset[str]:
    """Every keyword and function name the grammar spells, in upper case."""
    words = set(re.findall(r'"([a-z_]+)"i', _CORE))
    words |= set(_AGGREGATES) | set(_SCALARS) | set(_TYPES) | {"group_concat"}
    return frozenset(w.upper() for w in words)


def _literal(text: str, fold: bool = True) -> str:
    """``text`` as a Lark string literal (case ignored when ``fold``)."""
    return json.dumps(text) + ("i" if fold else "")


def identifier_forms(name: str) -> list[str]:
    """The ways SQLite lets a query write the name ``name``: bare (a plain identifier only),
    ``"name"``, `` `name` `` and ``[name]`` (quotes inside doubled; ``[...]`` when it has no
    ``]``)."""
    forms = [name] if _PLAIN.fullmatch(name) else []
    forms += ['"' + name.replace('"', '""') + '"', "`" + name.replace("`", "``") + "`"]
    if "]" not in name:
        forms.append(f"[{name}]")
    return forms


def _names_rule(rule: str, names: list[str]) -> str:
    alternatives = [_literal(f) for n in names for f in identifier_forms(n)]
    return f"{rule}: " + "\n    | ".join(alternatives)


def _alias_terminals() -> str:
    """``ALIAS`` (a result column's, at most 20 characters) and ``TABLE_ALIAS`` (a table's, and
    a column's qualifier, at most 3: ``T1``, ``s``, ``emp``): free identifiers that are no reserved word and do not
    begin with a clause keyword."""
    reserved = "|".join(w.lower() for w in RESERVED)
    clause = "|".join(w.lower() for w in CLAUSE_KEYWORDS)
    excluded = r" & ~/(?i:(" + reserved + r")|(" + clause + r")[A-Za-z0-9_]*)/"
    return (
        r"ALIAS: /[A-Za-z_][A-Za-z0-9_]{0,19}/" + excluded + "\n"
        r"TABLE_ALIAS: /[A-Za-z][A-Za-z0-9_]{0,2}/" + excluded
    )


def sql_lark(schema: Schema, multiline: bool = False) -> str:
    """The Lark grammar text of queries over ``schema`` (module docstring); ``multiline``:
    whitespace may hold newlines and tabs (else spaces only)."""
    if not isinstance(schema, Schema):
        raise TypeError(f"schema must be a Schema, got {type(schema).__name__}")
    space = r"_SP: /[ \t\r\n]+/" if multiline else "_SP: / +/"
    parts = [
        space,
        _CORE.strip(),
        _names_rule("table", [t.name for t in schema.tables]),
        _names_rule("column", list(schema.column_names)),
        "aggregate: " + " | ".join(_literal(f) for f in _AGGREGATES),
        "scalar: " + " | ".join(_literal(f) for f in dict.fromkeys(_SCALARS)),
        "type_name: " + " | ".join(_literal(t) for t in _TYPES),
        _alias_terminals(),
    ]
    return "\n".join(parts) + "\n"


_CACHE: OrderedDict[str, Grammar] = OrderedDict()
_CACHE_SIZE = 64


def sql_grammar(schema: Schema, multiline: bool = False) -> Grammar:
    """The compiled :class:`~llamppl.decoding.grammar.compile.Grammar` of :func:`sql_lark`,
    built once per grammar text (an LRU of the last 64)."""
    text = sql_lark(schema, multiline)
    grammar = _CACHE.get(text)
    if grammar is None:
        grammar = _CACHE[text] = Grammar.from_lark(text)
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(text)
    return grammar
