"""``canonical``: the constraint "the generated tokens are the tokenizer's own spelling".

"Language Models over Canonical Byte-Pair Encodings" (Vieira et al., ICML 2025;
``papers.md`` §7): t is canonical iff ``encode(decode(t)) == t``; for BPE iff every
adjacent pair is canonical (:mod:`llamppl.lm.bytes.canonical`). The constraint's state is
the last token (the prompt's last one to start with, ``after=``) and the tokens so far:

- prefix check (``allows``): the pair (last token, next token) is canonical;
- complete check (``ends``): the whole generated string is canonical, and so is its first
  pair with the prompt.

The pair test is exact on prefixes for BPE (a string is canonical iff its pairs are), so
no canonical string is cut; the complete check makes the final texts canonical for any
tokenizer. With :class:`~llamppl.models.HardConstraint` the program samples the LM
conditioned on canonicity ("canonicality by conditioning"); ``proposal="lazy"`` (what
``"auto"`` picks, since the pair mask over a whole vocabulary costs one tokenizer call per
token) checks only the tokens it draws::

    from llamppl.constraints import canonical
    model = HardConstraint(lm, prompt, canonical(after=lm.encode(prompt)), max_tokens=20)

**String verdicts.** Canonicity is a property of token strings; a text has exactly one
canonical spelling, the tokenizer's own ``lm.encode(text)``. So ``accepts_prefix(text)`` and
``accepts_end(text)`` are the verdicts of the walk of that spelling (the pair tests from the
prompt's last token on, then the complete check): whether the LM can write ``text``
canonically after the prompt. They need the tokenizer's LM, given as ``lm=``::

    c = canonical(after=lm.encode(prompt), lm=lm)
    c.accepts_end(" Paris")     # True unless the prompt's last token merges with " Paris"
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from llamppl.decoding.constraints.protocol import Constraint
from llamppl.lm.base import LanguageModel
from llamppl.lm.bytes.canonical import canonical_pair, is_canonical

__all__ = ["Canonical", "canonical"]


class Canonical(Constraint):
    """The generated token string stays canonical (module docstring).

    Parameters
    ----------
    after : int | None
        The prompt's last token id, paired with the first generated token (None: no pair).
    lm : LanguageModel | None
        The LM whose tokenizer spells texts for the string verdicts (module docstring);
        the token-level protocol takes its LM as an argument and does not need it.
    """

    def __init__(self, after: int | None = None, lm: LanguageModel | None = None) -> None:
        if lm is not None and not isinstance(lm, LanguageModel):
            raise TypeError(f"lm must be a LanguageModel or None, got {type(lm).__name__}")
        self.after = None if after is None else int(after)
        self.lm = lm

    def start(self, lm: LanguageModel) -> tuple[int | None, tuple[int, ...]]:
        return (self.after, ())

    def allows(self, lm: LanguageModel, state: Any, token: int) -> bool:
        last, _ = state
        return last is None or canonical_pair(lm, last, token)

    def ends(self, lm: LanguageModel, state: Any) -> bool:
        _, tokens = state
        return is_canonical(lm, tokens)

    def advance(self, lm: LanguageModel, state: Any, token: int) -> Any:
        _, tokens = state
        return (int(token), tokens + (int(token),))

    def masks(self, lm: LanguageModel, states: Sequence[Any]) -> torch.Tensor:
        """``(B, V)`` bool: every token's pair test (one tokenizer call per token and state)."""
        ends = list(lm.eos_token_ids)
        rows = []
        for state in states:
            row = torch.tensor([self.allows(lm, state, w) for w in range(lm.vocab_size)])
            row[ends] = self.ends(lm, state)
            rows.append(row)
        return torch.stack(rows).to(lm.device)

    def text_check(self, lm: LanguageModel, state: Any):
        return None  # the check is on tokens, not on text

    def walk(self, text: str) -> tuple[bool, bool]:
        """``(prefix, end)``: the walk of ``lm.encode(text)`` (module docstring), with the
        ``lm`` given at construction."""
        if self.lm is None:
            raise ValueError(
                "canonical judges token strings: give lm= (canonical(after=..., lm=lm)) to "
                "judge texts by the tokenizer's own spelling"
            )
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        state = self.start(self.lm)
        for token in self.lm.encode(text):
            if not self.allows(self.lm, state, token):
                return False, False
            state = self.advance(self.lm, state, token)
        return True, self.ends(self.lm, state)

    def accepts_prefix(self, text: str) -> bool:
        """Whether the tokenizer's own spelling of ``text`` passes every pair test."""
        return self.walk(text)[0]

    def accepts_end(self, text: str) -> bool:
        """Whether the LM may write ``text`` canonically and end (the walk's complete check)."""
        return self.walk(text)[1]

    def text_of(self, lm: LanguageModel, state: Any) -> str:
        return lm.decode(list(state[1]))

    def state_key(self) -> tuple:
        return ("canonical", self.after)


def canonical(
    after: Sequence[int] | int | None = None, lm: LanguageModel | None = None
) -> Canonical:
    """The constraint "the generated tokens are canonical"; ``after`` is the prompt's token
    ids (or its last id), whose last token is paired with the first generated one; ``lm``,
    the LM whose tokenizer spells texts for ``accepts_prefix`` / ``accepts_end``."""
    if after is None or isinstance(after, int):
        return Canonical(after, lm)
    ids = list(after)
    return Canonical(ids[-1] if ids else None, lm)
