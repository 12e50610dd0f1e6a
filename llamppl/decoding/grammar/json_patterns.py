"""The prefix check of the string ``pattern``s a grammar could not take: a constraint on JSON text.

When a schema's ``pattern`` uses what the grammar engine cannot parse (lookarounds,
backreferences), the grammar drops it (:mod:`~llamppl.decoding.grammar.json_relax`, which lists
it only at the paths where it applies to every string) and :class:`JSONStringPatterns`
checks it on the text instead, with the ``regex`` package: every string value at a path
under a rule must be extendable to a match while it is open (``regex.search(...,
partial=True)``) and must match once it is closed (JSON Schema's ``pattern`` is a search,
not a full match). A path lists object keys (``str``) and array positions (``int``) from
the root; a rule's steps are keys, positions, or the sets
:class:`~llamppl.decoding.grammar.json_relax.AnyKey` and
:class:`~llamppl.decoding.grammar.json_relax.AnyIndex`
(:func:`~llamppl.decoding.grammar.json_relax.rule_matches`). It is composed with the grammar
(``grammar & patterns``); being a Python check, it is checked lazily on the tokens drawn::

    patterns = JSONStringPatterns([(("password",), r"^(?=.*\\d)[a-z\\d]{6,}$")])
    patterns('{"password":"abc')    # True: may still become a match
    patterns('{"password":"abcdef"') # False: closed without a digit
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import regex

from llamppl.decoding.constraints.protocol import Constraint
from llamppl.decoding.constraints.time_bound import CheckTimeout, current_bound
from llamppl.decoding.grammar.json_relax import Step, rule_matches

__all__ = ["JSONStringPatterns", "string_values"]

_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def string_values(text: str) -> Iterator[tuple[tuple[str | int, ...], str, bool]]:
    """``(path, content, closed)`` of every string *value* in the JSON prefix ``text``.

    A path lists the (decoded) keys of the enclosing objects and the positions (``int``,
    from 0) in the enclosing arrays; ``content`` is the decoded string so far (an escape
    cut at the end of ``text`` is left out); ``closed`` says whether its closing quote is
    in ``text``. Keys are not values and are not reported.
    """
    stack: list[list] = []  # frames [kind "obj"/"arr", current key or position, expecting a key?]
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            content, i, closed = _read_string(text, i + 1)
            top = stack[-1] if stack else None
            if top is not None and top[0] == "obj" and top[2]:
                top[1], top[2] = content, False  # a key
            else:
                yield tuple(frame[1] for frame in stack), content, closed
            continue
        if ch in "{[":
            stack.append(["obj", None, True] if ch == "{" else ["arr", 0, False])
        elif ch in "}]":
            if stack:
                stack.pop()
        elif ch == "," and stack:
            if stack[-1][0] == "obj":
                stack[-1][2] = True
            else:
                stack[-1][1] += 1
        i += 1


def _read_string(text: str, i: int) -> tuple[str, int, bool]:
    """Decode the JSON string starting after its quote at ``i``: (content, next index, closed)."""
    out: list[str] = []
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            return "".join(out), i + 1, True
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        if i + 1 >= n:
            return "".join(out), n, False
        esc = text[i + 1]
        if esc == "u":
            digits = text[i + 2 : i + 6]
            if len(digits) < 4:
                return "".join(out), n, False
            try:
                out.append(chr(int(digits, 16)))
            except ValueError:
                out.append("\ufffd")
            i += 6
        else:
            out.append(_ESCAPES.get(esc, esc))
            i += 2
    return "".join(out), n, False


class JSONStringPatterns(Constraint):
    """String values at given JSON paths must match given patterns (search semantics).

    ``rules`` is a sequence of ``(path, pattern)``; a path's steps are keys (``str``),
    array positions (``int``) or :class:`~llamppl.decoding.grammar.json_relax.AnyKey` /
    :class:`~llamppl.decoding.grammar.json_relax.AnyIndex` (any key but some, any position from
    some on). A pattern the ``regex`` package cannot compile is left to the final
    ``jsonschema`` check. Text with a replacement character (a multi-byte character split
    across tokens) is not judged until it is complete.
    """

    def __init__(self, rules: Sequence[tuple[Sequence[Step], str]]) -> None:
        self.rules: list[tuple[tuple[Step, ...], regex.Pattern]] = []
        for path, pattern in rules:
            try:
                self.rules.append((tuple(path), regex.compile(pattern)))
            except regex.error:
                continue

    def _ok(self, text: str, final: bool) -> bool:
        for path, content, closed in string_values(text):
            if "\ufffd" in content:
                continue
            for rule, pattern in self.rules:
                if not rule_matches(rule, path):
                    continue
                try:
                    found = pattern.search(
                        content, partial=not (closed or final), timeout=current_bound()
                    )
                except TimeoutError:
                    raise CheckTimeout(f"pattern {pattern.pattern!r}") from None
                if found is None:
                    return False
        return True

    def __call__(self, text: str) -> bool:
        return self._ok(text, final=False)

    def accepts_end(self, text: str) -> bool:
        return self._ok(text, final=True)

    def __repr__(self) -> str:
        return f"JSONStringPatterns({[(p, r.pattern) for p, r in self.rules]!r})"
