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
  grammar again, recursing per ``$ref`` hop), and copied on the caller's thread after that;
- :func:`new_matcher` — a fresh matcher of a grammar over any llguidance tokenizer, with
  the engine limits :data:`ENGINE_LIMITS`.

**Engine limits are per matcher, never sticky.** llguidance builds its lexer lazily and
the copies of one matcher share it, with one budget of lexer work (``initial_lexer_fuel``,
:data:`ENGINE_LIMITS`): once a walk spends it, the shared lexer fails every copy, even on a
grammar's first ``{`` ("lexer error: too many expressions constructed"). So a matcher that
reports an engine error drops the kept first matcher of its (grammar, LM) and the next
particle starts from a fresh one (:func:`forget_template`); :meth:`MatcherState.allows`
tells such a failure from a refusal and raises
:class:`~llamppl.decoding.constraints.protocol.ConstraintFailure` instead of refusing
silently.

A grammar here is anything with the compiled llguidance ``spec`` and a ``kind``
(:class:`~llamppl.decoding.grammar.compile.Grammar`)::

    state = MatcherState(lm, grammar)
    state.allows(token_id), state.consume(token_id), state.accepting
"""

from __future__ import annotations

from typing import Any

import torch

from llamppl.decoding.constraints.protocol import ConstraintFailure
from llamppl.decoding.grammar.native_stack import on_native_stack
from llamppl.lm.base import LanguageModel
from llamppl.lm.memo import LRU, PerLM

__all__ = [
    "ENGINE_LIMITS",
    "MatcherState",
    "engine_failure",
    "forget_template",
    "ll_tokenizer",
    "new_matcher",
    "require_llguidance",
]

#: Lexer work one matcher (and its copies) may spend, in llguidance's fuel units (about 0.1 µs
#: each): 20x llguidance's default of 1,000,000, which some real schemas exceed on one valid
#: text (a dozen long ``pattern`` strings with ``maxLength``); at most about 2 s of work.
INITIAL_LEXER_FUEL = 20_000_000
#: The other limits are llguidance's defaults (``LLParserLimits``).
ENGINE_LIMITS = {"initial_lexer_fuel": INITIAL_LEXER_FUEL}

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


def limits():
    """A fresh ``llguidance.LLParserLimits`` with :data:`ENGINE_LIMITS`."""
    return require_llguidance().LLParserLimits(**ENGINE_LIMITS)


def new_matcher(tokenizer: Any, spec: str):
    """A fresh ``LLMatcher`` of the grammar ``spec`` over an llguidance ``tokenizer``, with
    :data:`ENGINE_LIMITS` (its own lexer and lexer budget, shared with no other matcher)."""
    llg = require_llguidance()
    return llg.LLMatcher(tokenizer, spec, log_level=0, limits=limits())


#: How llguidance words a refused token (the first line of its error): every other error is
#: the engine failing (a resource limit: "lexer error: too many expressions constructed", ...).
_REFUSALS = ("doesn't satisfy the grammar", "parser stopped", "NoExtension")


def engine_failure(matcher: Any) -> str | None:
    """The engine's error when ``matcher`` failed for a reason other than refusing a token
    (a resource limit: "lexer error: ...", "Too many items", ...), else None."""
    if not matcher.is_error():
        return None
    message = matcher.get_error().strip()
    first = message.split("\n", 1)[0]
    return None if any(r in first for r in _REFUSALS) else message


_TEMPLATES = PerLM(lambda lm: LRU(64))  # per LM: grammar spec -> fresh LLMatcher


def forget_template(lm: LanguageModel, grammar: Any) -> None:
    """Drop the kept first matcher of ``grammar`` for ``lm`` (its shared lexer failed): the
    next :class:`MatcherState` builds a fresh one."""
    _TEMPLATES(lm).pop(grammar.spec)


def _template(lm: LanguageModel, grammar: Any):
    """The fresh ``LLMatcher`` of ``grammar`` for ``lm``, built once (lexer build) and kept.

    The build compiles the grammar again, so it runs :func:`on_native_stack`; a kept
    matcher is returned at once (the per-particle path).
    """
    per_lm = _TEMPLATES(lm)
    matcher = per_lm.get(grammar.spec)
    if matcher is None:
        tokenizer = ll_tokenizer(lm)
        matcher = on_native_stack(lambda: new_matcher(tokenizer, grammar.spec))
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
        """Advance by a non-EOS token; False (and the state is dead) if the grammar forbids it
        or the engine failed (``engine_error``; the kept first matcher is then dropped)."""
        ok = self.matcher.consume_token(int(token_id))
        self.consumed.append(int(token_id))
        self.filled = None
        if self.matcher.is_error():
            self.engine_error = self.matcher.get_error().strip()
            if engine_failure(self.matcher):
                forget_template(self.lm, self.grammar)
            return False
        return bool(ok)

    def allows(self, token_id: int) -> bool:
        """Whether the grammar allows the non-EOS token next (the state does not move).

        A refusal is confirmed on a copy: when the engine failed instead (its shared lexer
        out of budget, which ``validate_tokens`` does not report), the kept first matcher is
        dropped and :class:`~llamppl.decoding.constraints.protocol.ConstraintFailure` names
        the engine's error.
        """
        if self.matcher.validate_tokens([int(token_id)]) == 1:
            return True
        probe = self.matcher.deep_copy()
        probe.consume_token(int(token_id))
        failure = engine_failure(probe)
        if failure is not None:
            forget_template(self.lm, self.grammar)
            raise ConstraintFailure(f"grammar engine: {failure.splitlines()[0]}")
        return False

    def check_engine(self) -> None:
        """Raise :class:`~llamppl.decoding.constraints.protocol.ConstraintFailure` (and drop
        the kept first matcher) if the engine failed on this state, say while computing a
        mask."""
        failure = engine_failure(self.matcher)
        if failure is not None:
            self.engine_error = failure
            forget_template(self.lm, self.grammar)
            raise ConstraintFailure(f"grammar engine: {failure.splitlines()[0]}")

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
