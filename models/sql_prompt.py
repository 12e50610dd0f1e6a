"""The prompt of :func:`~llamppl.models.text_to_sql`: a database's schema, a question, and examples.

The model sees a chat (the LM's own chat template): a system message that asks for one
SQLite query, then worked examples over a small library database of our own (not any
benchmark's), each a user question and the assistant's query, and last the user's
database as ``CREATE TABLE`` statements (:meth:`~llamppl.decoding.sql.constraint.SQL.
schema_text`) with the question. The examples come first and never change, so the token
trie of a :class:`~llamppl.CachedCausalLM` runs them once for every question asked in a
process, and the schema next, shared by every question on the same database::

    from llamppl.models.sql_prompt import sql_messages
    messages = sql_messages("CREATE TABLE singer (name text, age int);", "How many singers?")

``examples=()`` leaves the examples out; a list of :class:`SQLExample` (with their own
``schema``) replaces them, for instance with examples from other databases of one's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["EXAMPLES", "EXAMPLE_SCHEMA", "SQLExample", "SYSTEM_MESSAGE", "sql_messages"]

SYSTEM_MESSAGE = (
    "You write SQLite queries. Given the tables of a database and a question, answer with "
    "one SQL query that answers the question, and nothing else."
)

#: The schema of the built-in examples: a small library database (ours).
EXAMPLE_SCHEMA = """CREATE TABLE author (author_id INTEGER PRIMARY KEY, name TEXT, country TEXT, birth_year INTEGER);
CREATE TABLE book (book_id INTEGER PRIMARY KEY, title TEXT, author_id INTEGER REFERENCES author(author_id), year INTEGER, pages INTEGER, genre TEXT);
CREATE TABLE loan (loan_id INTEGER PRIMARY KEY, book_id INTEGER REFERENCES book(book_id), member TEXT, loan_date TEXT);"""


@dataclass(frozen=True)
class SQLExample:
    """A worked example: a question and its query over ``schema`` (``CREATE TABLE`` text)."""

    question: str
    sql: str
    schema: str = EXAMPLE_SCHEMA


#: The built-in examples: counting, filtering, ordering, aggregates, distinct values, grouping,
#: the most frequent value, joins with aliases, ``HAVING``, ``NOT IN`` and scalar subqueries,
#: in the plain style of hand-written SQL (``count(*)``, ``T1``/``T2`` aliases, a final ``;``).
EXAMPLES: tuple[SQLExample, ...] = (
    SQLExample("How many books are there?", "SELECT count(*) FROM book;"),
    SQLExample(
        "How many authors come from France?",
        "SELECT count(*) FROM author WHERE country = 'France';",
    ),
    SQLExample(
        "List the titles of all books sorted alphabetically.",
        "SELECT title FROM book ORDER BY title;",
    ),
    SQLExample(
        "What are the titles of the books published after 2000, newest first?",
        "SELECT title FROM book WHERE year > 2000 ORDER BY year DESC;",
    ),
    SQLExample(
        "What is the average, minimum and maximum number of pages?",
        "SELECT avg(pages), min(pages), max(pages) FROM book;",
    ),
    SQLExample(
        "Show the name and birth year of the youngest author.",
        "SELECT name, birth_year FROM author ORDER BY birth_year DESC LIMIT 1;",
    ),
    SQLExample("What are the different genres?", "SELECT DISTINCT genre FROM book;"),
    SQLExample(
        "How many books are there in each genre?",
        "SELECT genre, count(*) FROM book GROUP BY genre;",
    ),
    SQLExample(
        "Which country do the most authors come from?",
        "SELECT country FROM author GROUP BY country ORDER BY count(*) DESC LIMIT 1;",
    ),
    SQLExample(
        "What are the titles of the books written by authors from Spain?",
        "SELECT T2.title FROM author AS T1 JOIN book AS T2 ON T1.author_id = T2.author_id "
        "WHERE T1.country = 'Spain';",
    ),
    SQLExample(
        "Show the name of each author and the number of books they wrote.",
        "SELECT T1.name, count(*) FROM author AS T1 JOIN book AS T2 ON T1.author_id = "
        "T2.author_id GROUP BY T1.author_id;",
    ),
    SQLExample(
        "Which genres have more than 10 books?",
        "SELECT genre FROM book GROUP BY genre HAVING count(*) > 10;",
    ),
    SQLExample(
        "Find the titles of the books that were never loaned.",
        "SELECT title FROM book WHERE book_id NOT IN (SELECT book_id FROM loan);",
    ),
    SQLExample(
        "What are the titles of the books with more pages than the average?",
        "SELECT title FROM book WHERE pages > (SELECT avg(pages) FROM book);",
    ),
)


def _user(schema: str, question: str, with_schema: bool) -> str:
    if with_schema:
        return f"Tables:\n{schema}\n\nQuestion: {question}"
    return f"Question: {question}"


def sql_messages(
    schema: str,
    question: str,
    examples: Sequence[SQLExample] = EXAMPLES,
    system: str = SYSTEM_MESSAGE,
) -> list[dict]:
    """The chat of one question (module docstring): system message, examples (their schema
    shown once per run of examples on the same schema), then ``schema`` and ``question``."""
    if not isinstance(schema, str) or not schema.strip():
        raise ValueError("schema must be a non-empty str (CREATE TABLE text)")
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question must be a non-empty str")
    if isinstance(examples, SQLExample) or not all(isinstance(e, SQLExample) for e in examples):
        raise TypeError("examples must be a sequence of SQLExample")
    messages = [{"role": "system", "content": system}]
    shown = None
    for ex in examples:
        messages.append(
            {"role": "user", "content": _user(ex.schema, ex.question, ex.schema != shown)}
        )
        messages.append({"role": "assistant", "content": ex.sql})
        shown = ex.schema
    messages.append({"role": "user", "content": _user(schema, question.strip(), True)})
    return messages
