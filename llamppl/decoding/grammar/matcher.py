"""The llguidance adapter's lowest layer: tokenizers and one particle's matcher.

- :func:`require_llguidance` — import llguidance or say what to install;
- :func:`ll_tokenizer` — the llguidance tokenizer of an LM, built once per LM: from
  the HF fast tokenizer of a :class:`~llamppl.CachedCausalLM`
  (``llguidance.hf.from_tokenizer``) or, for :class:`~llamppl.FunctionLM` and other
  small LMs, from the list of token byte strings;
- :class:`MatcherState` — one particle's matcher (``llguidance.LLMatcher``), cloned
  with ``deep_copy()`` when the particle is cloned (``copy.deepcopy``); the first
  matcher of a grammar is built once per (grammar, LM), on a large native stack
  (:func:`~llamppl.decoding.grammar.native_stack.on_native_stack`: the build compiles the
  grammar again, recursing per ``$ref`` hop), and copied on the caller's thread after that.

A grammar here is anything with the compiled llguidance ``spec`` and a ``kind``
(:class:`~llamppl.decoding.grammar.compile.Grammar`)::

    state = MatcherState(lm, grammar)
    state.allows(token_id), state.consume(token_id), state.accepting
"""

from __future__ import annotations

from typing import Any

import torch

from llamppl.decoding.grammar.native_stack import on_native_stack
from llamppl.lm.base import LanguageModel
from llamppl.lm.memo import LRU, PerLM

__all__ = ["MatcherState", "ll_tokenizer", "require_llguidance"]

_INSTALL_HINT = "grammar constraints need the llguidance package: pip install 'llamppl[grammar]'"


def require_llguidance():
    """Import ``llguidance`` or raise an ImportError saying what to install."""
    try:
        import llguidance
        import llguidance.torch  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(_INSTALL_HINT) from exc
    return llguidance


class _VocabTokenizer:
    """The tokenizer protocol llguidance's ``TokenizerWrapper`` expects, over a token list.

    Used for LMs without an HF fast tokenizer (``FunctionLM``): token i is
    ``lm.vocab[i]`` in UTF-8, EOS/BOS are special (empty bytes); encoding is greedy
    longest match (llguidance only uses it for token healing hints).
    """

    def __init__(self, lm: LanguageModel) -> None:
        special = {lm.eos_token_id} | ({lm.bos_token_id} - {None})
        self.eos_token_id = lm.eos_token_id
        self.bos_token_id = lm.bos_token_id
        self.special_token_ids = sorted(special)
        self.tokens = [b"" if i in special else t.encode() for i, t in enumerate(lm.vocab)]
        self._by_length = sorted(
            (i for i in range(len(self.tokens)) if self.tokens[i]),
            key=lambda i: -len(self.tokens[i]),
        )

    def __call__(self, text: bytes | str) -> list[int]:
        data = text.encode() if isinstance(text, str) else bytes(text)
        ids, pos = [], 0
        while pos < len(data):
            for i in self._by_length:
                if data.startswith(self.tokens[i], pos):
                    ids.append(i)
                    pos += len(self.tokens[i])
                    break
            else:
                pos += 1  # a byte no token spells: skip it
        return ids


def _build_ll_tokenizer(lm: LanguageModel):
    llg = require_llguidance()
    hf = getattr(lm, "tokenizer", None)
    if hf is not None and getattr(hf, "is_fast", False):
        import llguidance.hf

        return llguidance.hf.from_tokenizer(hf, n_vocab=lm.vocab_size, eos_token=lm.eos_token_id)
    return llg.LLTokenizer(llg.TokenizerWrapper(_VocabTokenizer(lm)), slices=[])


_TOKENIZERS = PerLM(_build_ll_tokenizer)


def ll_tokenizer(lm: LanguageModel):
    """The llguidance ``LLTokenizer`` for ``lm`` (built once per LM, ~1 s for a 49k vocabulary)."""
    if not isinstance(lm, LanguageModel):
        raise TypeError(f"lm must be a LanguageModel, got {type(lm).__name__}")
    return _TOKENIZERS(lm)


_TEMPLATES = PerLM(lambda lm: LRU(64))  # per LM: grammar spec -> fresh LLMatcher


def _template(lm: LanguageModel, grammar: Any):
    """The fresh ``LLMatcher`` of ``grammar`` for ``lm``, built once (lexer build) and kept.

    The build compiles the grammar again, so it runs :func:`on_native_stack`; a kept
    matcher is returned at once (the per-particle path).
    """
    per_lm = _TEMPLATES(lm)
    matcher = per_lm.get(grammar.spec)
    if matcher is None:
        llg = require_llguidance()
        tokenizer = ll_tokenizer(lm)
        matcher = on_native_stack(lambda: llg.LLMatcher(tokenizer, grammar.spec, log_level=0))
        if matcher.is_error():
            raise ValueError(
                f"invalid {grammar.kind}: llguidance says: {matcher.get_error().strip()}"
            )
        per_lm.put(grammar.spec, matcher)
    return matcher


class MatcherState:
    """One particle's grammar matcher over the tokens generated so far.

    ``copy.deepcopy`` (hence ``Model.clone``) copies the matcher with
    ``LLMatcher.deep_copy()``; the LM and the grammar are shared. ``engine_error`` is
    llguidance's message when the engine failed (a limit: "Too many items").
    """

    def __init__(self, lm: LanguageModel, grammar: Any) -> None:
        self.lm, self.grammar = lm, grammar
        self.matcher = _template(lm, grammar).deep_copy()
        self.consumed: list[int] = []
        self.engine_error: str | None = None
        self.filled: torch.Tensor | None = None  # (1, W) bitmask of this state, if computed

    @property
    def accepting(self) -> bool:
        """Whether the text so far is a complete sentence of the grammar (EOS allowed)."""
        return self.matcher.is_accepting()

    def consume(self, token_id: int) -> bool:
        """Advance by a non-EOS token; False (and the state is dead) if the grammar forbids it."""
        ok = self.matcher.consume_token(int(token_id))
        self.consumed.append(int(token_id))
        self.filled = None
        if self.matcher.is_error():
            self.engine_error = self.matcher.get_error().strip()
            return False
        return bool(ok)

    def allows(self, token_id: int) -> bool:
        """Whether the grammar allows the non-EOS token next (the state does not move)."""
        return self.matcher.validate_tokens([int(token_id)]) == 1

    def state_key(self) -> tuple:
        return (self.grammar.spec, tuple(self.consumed))

    def __deepcopy__(self, memo) -> MatcherState:
        new = object.__new__(MatcherState)
        new.lm, new.grammar = self.lm, self.grammar
        new.matcher = self.matcher.deep_copy()
        new.consumed = list(self.consumed)
        new.engine_error = self.engine_error
        new.filled = self.filled  # never written in place: shared by the copies
        return new
