"""Judging a text with a grammar and no LM: the byte-level walk behind ``Grammar.accepts_prefix``.

A grammar's verdicts on a text are those of its token-level walk (``start`` / ``allows`` /
``advance`` / ``ends`` with an LM), which do not depend on the LM: llguidance decides a
token by its bytes. So :func:`walk_text` walks the text's UTF-8 bytes through a matcher of
the grammar over a *byte vocabulary* (256 one-byte tokens and an end token, built once):

- the text is a prefix of the grammar's language iff every byte is consumed;
- it is a sentence of the language iff, besides, the matcher then accepts.

A verdict never depends on the texts judged before it, and a rebuilt grammar judges like
the first. Each walk runs on a copy of the grammar's first byte matcher (built once per
grammar string, on a large native stack as every grammar build is, and kept in an LRU of
:data:`KEPT` grammars): the copies share the lexer llguidance builds lazily, so a grammar
whose build is slow (a second for some relaxed schemas) is built once, and states a walk
built serve the next. The shared lexer also shares one budget of lexer work; a walk that
meets an engine failure (a resource limit, not a refusal) is therefore run again on a fresh
matcher (:func:`~llamppl.decoding.grammar.matcher.new_matcher`, its own lexer and budget)
after the kept one is dropped, and only a failure there counts: it raises
:class:`~llamppl.decoding.constraints.protocol.ConstraintFailure` naming the engine's error,
as the token-level walk does (the particle's failure), instead of answering False. The
engine is deterministic, so a walk that meets no failure answers as a fresh matcher would::

    from llamppl.decoding.grammar.strings import walk_text
    walk = walk_text(Grammar.from_regex("(ab|b)+c").spec, "abb")
    walk.prefix, walk.sentence      # (True, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from llamppl.decoding.constraints.protocol import ConstraintFailure
from llamppl.decoding.grammar.matcher import engine_failure, new_matcher, require_llguidance
from llamppl.decoding.grammar.native_stack import on_native_stack
from llamppl.lm.memo import LRU

__all__ = ["KEPT", "Walk", "byte_tokenizer", "forget_kept", "walk_text"]

#: Grammars whose first byte matcher is kept (least recently used dropped first).
KEPT = 16
_FIRST: LRU[str, object] = LRU(KEPT)  # grammar string -> its fresh byte matcher

_END = 256  # the byte vocabulary's end token


class _Bytes:
    """The tokenizer protocol of llguidance's ``TokenizerWrapper``: token ``b`` is the byte
    ``b`` (0-255), token 256 the end token."""

    eos_token_id = _END
    bos_token_id = None
    special_token_ids = [_END]
    tokens = [bytes([b]) for b in range(256)] + [b""]

    def __call__(self, text: bytes | str) -> list[int]:
        return list(text.encode() if isinstance(text, str) else bytes(text))


@lru_cache(maxsize=1)
def byte_tokenizer():
    """The llguidance tokenizer of the byte vocabulary (built once)."""
    llg = require_llguidance()
    return llg.LLTokenizer(llg.TokenizerWrapper(_Bytes()), slices=[])


@dataclass(frozen=True)
class Walk:
    """Where a text's bytes went through a grammar.

    Attributes
    ----------
    consumed, total : int
        Bytes the grammar took, of the text's ``total`` UTF-8 bytes.
    accepting : bool
        Whether the matcher accepted after taking every byte.
    """

    consumed: int
    total: int
    accepting: bool

    @property
    def prefix(self) -> bool:
        """Whether the text is a prefix of a sentence of the grammar."""
        return self.consumed == self.total

    @property
    def sentence(self) -> bool:
        """Whether the text is a sentence of the grammar."""
        return self.prefix and self.accepting


def forget_kept() -> None:
    """Drop every kept first byte matcher (the next walk of each grammar builds one afresh)."""
    _FIRST.clear()


def _first_matcher(spec: str):
    """The kept fresh byte matcher of ``spec`` (built on a native stack the first time)."""
    matcher = _FIRST.get(spec)
    if matcher is None:
        matcher = on_native_stack(lambda: new_matcher(byte_tokenizer(), spec))
        _FIRST.put(spec, matcher)
    return matcher


def _walk(matcher, data: list[int]) -> tuple[int, bool, str | None]:
    """``(bytes consumed, accepting, engine failure or None)`` of ``data`` through ``matcher``."""
    consumed = matcher.try_consume_tokens(data) if data else 0
    if consumed < len(data):
        matcher.consume_token(data[consumed])  # refused: the engine says why
    failure = engine_failure(matcher)
    return consumed, failure is None and consumed == len(data) and matcher.is_accepting(), failure


def walk_text(spec: str, text: str) -> Walk:
    """The walk of ``text``'s UTF-8 bytes through the grammar ``spec`` (module docstring).

    Raises :class:`~llamppl.decoding.constraints.protocol.ConstraintFailure` when the engine
    fails on the text on a fresh matcher (a resource limit); ``TypeError`` for a ``text``
    that is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    data = list(text.encode("utf-8", "surrogatepass"))  # a lone surrogate: bytes no grammar takes
    consumed, accepting, failure = _walk(_first_matcher(spec).deep_copy(), data)
    if failure is not None:  # the shared lexer's budget, or the text's own: walk afresh
        _FIRST.pop(spec)
        fresh = on_native_stack(lambda: new_matcher(byte_tokenizer(), spec))
        consumed, accepting, failure = _walk(fresh, data)
        if failure is not None:
            raise ConstraintFailure(f"grammar engine: {failure.splitlines()[0]}")
    return Walk(consumed, len(data), accepting)
