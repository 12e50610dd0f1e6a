"""Vocabulary masks: token-id sets computed once per LM from its decoded vocabulary ``lm.vocab``.

``lm.masks.STARTS_NEW_WORD`` etc. (LLaMPPL names) are :class:`TokenSet` objects:
frozensets of token ids (``id in mask``, ``a | b`` work as in LLaMPPL) that also
carry a ``(V,)`` bool tensor on ``lm.device`` (``mask.tensor``), which
``LMContext.mask_dist`` uses directly, so masking costs no per-call conversion.
Every table is built with one pass over the vocabulary on first access and
cached on the LM (:func:`llamppl.lm.memo.lm_table`); ``decoding.constraints``
reuses the same per-token statistics (:func:`word_stats`).

Definitions, on the text ``t = lm.vocab[i]`` (byte-level BPE and SentencePiece
vocabularies are decoded to text by the LM, so the same rules apply to both):

- ``STARTS_NEW_WORD``: one leading space then letters only (``" the"``);
- ``CONTINUES_CURRENT_WORD``: letters only (``"ing"``);
- ``PUNCTUATION``: non-empty, every character in ``string.punctuation``;
- ``END_SENTENCE_PUNCT``: only ``.``, ``!``, ``?``;
- ``MID_PUNCTUATION``: only ``,``, ``:``, ``;``;
- ``CONTAINS_WHITESPACE``: some whitespace character;
- ``EOS``: ``{lm.eos_token_id}``; ``ALL_TOKENS``: every id.

EOS is in no mask but ``EOS`` and ``ALL_TOKENS``.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

import torch

from .memo import PerLM

__all__ = ["TokenSet", "VocabMasks", "masks_for", "word_stats"]


class TokenSet(frozenset):
    """A frozenset of token ids with its ``(V,)`` bool tensor ``tensor`` on the LM's device."""

    tensor: torch.Tensor

    @classmethod
    def from_tensor(cls, mask: torch.Tensor) -> TokenSet:
        out = cls(torch.nonzero(mask).flatten().tolist())
        out.tensor = mask
        return out


def leading_letters(text: str) -> int:
    """Length of the run of letters that starts ``text``."""
    n = 0
    while n < len(text) and text[n].isalpha():
        n += 1
    return n


def _longest_run(text: str) -> int:
    best = run = 0
    for ch in text:
        run = run + 1 if ch.isalpha() else 0
        best = max(best, run)
    return best


def _build_word_stats(lm: Any) -> dict[str, torch.Tensor]:
    lead = [leading_letters(t) for t in lm.vocab]
    longest = [_longest_run(t) for t in lm.vocab]
    has_other = [any(not ch.isalpha() for ch in t) for t in lm.vocab]
    dev = lm.device
    return {
        "lead": torch.tensor(lead, dtype=torch.long, device=dev),  # letters before a non-letter
        "longest": torch.tensor(longest, dtype=torch.long, device=dev),  # longest letter run
        "has_other": torch.tensor(has_other, dtype=torch.bool, device=dev),  # any non-letter
    }


_WORD_STATS = PerLM(_build_word_stats)


def word_stats(lm: Any) -> dict[str, torch.Tensor]:
    """Per-token letter-run statistics of ``lm.vocab``: ``(V,)`` tensors ``lead``, ``longest``, ``has_other``."""
    return _WORD_STATS(lm)


def _only(chars: str) -> Callable[[str], bool]:
    allowed = set(chars)
    return lambda t: bool(t) and all(c in allowed for c in t)


_RULES: dict[str, Callable[[str], bool]] = {
    "STARTS_NEW_WORD": lambda t: len(t) > 1 and t[0] == " " and t[1:].isalpha(),
    "CONTINUES_CURRENT_WORD": lambda t: t.isalpha(),
    "PUNCTUATION": _only(string.punctuation),
    "END_SENTENCE_PUNCT": _only(".!?"),
    "MID_PUNCTUATION": _only(",:;"),
    "CONTAINS_WHITESPACE": lambda t: any(c.isspace() for c in t),
}


_STRIPPED_LENGTHS = PerLM(
    lambda lm: torch.tensor([len(t.strip()) for t in lm.vocab], device=lm.device)
)


class VocabMasks:
    """The masks of one LM (see the module docstring); each built on first access, then cached."""

    def __init__(self, lm: Any) -> None:
        self._lm = lm
        self._cache: dict[str, TokenSet] = {}

    def token_length_mask(self, min: int | None = None, max: int | None = None) -> TokenSet:
        """Ids whose text, stripped of surrounding whitespace, has ``min <= len <= max`` characters."""
        n = _STRIPPED_LENGTHS(self._lm)
        mask = torch.ones_like(n, dtype=torch.bool)
        if min is not None:
            mask &= n >= min
        if max is not None:
            mask &= n <= max
        return TokenSet.from_tensor(mask)

    def names(self) -> list[str]:
        return [*_RULES, "EOS", "ALL_TOKENS"]

    def __getattr__(self, name: str) -> TokenSet:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._cache:
            self._cache[name] = TokenSet.from_tensor(self._build(name))
        return self._cache[name]

    def _build(self, name: str) -> torch.Tensor:
        lm = self._lm
        V, eos = lm.vocab_size, lm.eos_token_id
        if name == "ALL_TOKENS":
            return torch.ones(V, dtype=torch.bool, device=lm.device)
        if name == "EOS":
            mask = torch.zeros(V, dtype=torch.bool, device=lm.device)
        elif name in _RULES:
            rule = _RULES[name]
            mask = torch.tensor([rule(t) for t in lm.vocab], dtype=torch.bool, device=lm.device)
        else:
            raise AttributeError(f"no vocabulary mask {name!r}; known: {', '.join(self.names())}")
        mask[eos] = name == "EOS"
        return mask


_MASKS = PerLM(VocabMasks)


def masks_for(lm: Any) -> VocabMasks:
    """The (cached) :class:`VocabMasks` of ``lm``."""
    return _MASKS(lm)
