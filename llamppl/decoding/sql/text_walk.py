"""A grammar's verdict on a string, byte by byte, without a language model.

The SQL constraint answers ``accepts_prefix(text)`` / ``accepts_end(text)`` on strings
(:mod:`~llamppl.decoding.sql.constraint`); its grammar part is walked here: an llguidance
matcher over a tokenizer whose tokens are the 256 bytes (built once per process), fed the
text's UTF-8 bytes one at a time. llguidance matches bytes, so the verdict is the same as
for any tokenization of the text::

    from llamppl.decoding.sql.text_walk import grammar_verdict
    grammar_verdict(grammar, "SELECT name FROM singer")   # (True, True): a prefix; complete
"""

from __future__ import annotations

from functools import lru_cache

from llamppl.decoding.grammar.compile import Grammar
from llamppl.decoding.grammar.matcher import require_llguidance
from llamppl.decoding.grammar.native_stack import on_native_stack

__all__ = ["grammar_verdict"]

_EOS = 256


class _ByteTokens:
    """llguidance's tokenizer protocol over the 256 bytes (token i is byte i; 256 is EOS)."""

    eos_token_id = _EOS
    bos_token_id = None
    special_token_ids = [_EOS]
    tokens = [bytes([i]) for i in range(256)] + [b""]

    def __call__(self, text: bytes | str) -> list[int]:
        return list(text.encode() if isinstance(text, str) else bytes(text))


@lru_cache(maxsize=1)
def _byte_tokenizer():
    llg = require_llguidance()
    return llg.LLTokenizer(llg.TokenizerWrapper(_ByteTokens()))


@lru_cache(maxsize=64)
def _template(spec: str):
    llg = require_llguidance()
    tokenizer = _byte_tokenizer()
    return on_native_stack(lambda: llg.LLMatcher(tokenizer, spec, log_level=0))


def grammar_verdict(grammar: Grammar, text: str) -> tuple[bool, bool]:
    """``(prefix, complete)``: whether ``text`` is a prefix of the grammar's language, and
    whether it is a sentence of it."""
    if not isinstance(grammar, Grammar):
        raise TypeError(f"grammar must be a Grammar, got {type(grammar).__name__}")
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    matcher = _template(grammar.spec).deep_copy()
    for byte in text.encode("utf-8", "surrogatepass"):
        if not matcher.consume_token(byte) or matcher.is_error():
            return False, False
    return True, bool(matcher.is_accepting())
