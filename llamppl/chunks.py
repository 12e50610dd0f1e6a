"""Word-level chunks: submodels that generate a whole word in one ``step`` (LLaMPPL's ``chunks``).

``await self.call(sample_word(self.context))`` samples one word token by token
with the vocabulary masks of ``lm.masks`` (``llamppl.lm.masks``). Each choice
is a ``mask_dist`` sample or a masked ``next_token()`` sample drawn from its
own distribution, so the particle's weight is unchanged except by the
observations (LLaMPPL paper §2.2, token masking; successive mask observations
combine, see ``LMTokenMask``):

1. observe that the next token starts a word (a space then letters, or letters
   only if the context already ends in a space or opening quote);
2. repeat: sample a token; stop when ``mask_dist(CONTINUES_CURRENT_WORD)``
   samples False, or observe False after ``max_tokens`` tokens;
3. optionally sample whether punctuation follows, and if so one punctuation token.

Returns ``(word, punctuation)``, both strings.
"""

from __future__ import annotations

import torch

from .submodel import submodel
from .validation import is_integer

__all__ = ["sample_word", "sample_word_2"]

_NO_SPACE_NEEDED = ("", " ", "\n", "\t", "-", "'", '"', "(")


@submodel
async def sample_word(self, context, max_tokens: int = 5, allow_punctuation: bool = True):
    """Sample one word (and optional punctuation) from ``context``; returns ``(word, punctuation)``."""
    if not is_integer(max_tokens) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
    lm, masks = context.lm, context.lm.masks
    last = lm.vocab[context.tokens[-1]][-1:] if context.tokens else ""
    first = masks.CONTINUES_CURRENT_WORD if last in _NO_SPACE_NEEDED else masks.STARTS_NEW_WORD
    await self.observe(context.mask_dist(first), True)
    word = ""
    for n in range(1, max_tokens + 1):
        token = await self.sample(context.next_token())
        word += lm.vocab[int(token)]
        if n == max_tokens:
            await self.observe(context.mask_dist(masks.CONTINUES_CURRENT_WORD), False)
            break
        if not await self.sample(context.mask_dist(masks.CONTINUES_CURRENT_WORD)):
            break
    punctuation = ""
    if allow_punctuation and await self.sample(context.mask_dist(masks.PUNCTUATION)):
        punctuation = lm.vocab[int(await self.sample(context.next_token()))]
    return word, punctuation


@submodel
async def sample_word_2(
    self,
    context,
    max_chars: int | None = None,
    allow_mid_punctuation: bool = True,
    allow_end_punctuation: bool = True,
):
    """Sample one word of at most ``max_chars`` letters, then optional punctuation; ``(word, punctuation)``.

    Like :func:`sample_word`, but the length limit is in characters and is a
    mask (tokens that would overflow are never proposed, so no particle dies
    of it); the punctuation, if any, is one ``MID_PUNCTUATION`` token (``,:;``)
    and/or ``END_SENTENCE_PUNCT`` token (``.!?``), as allowed.
    """
    if max_chars is not None and (not is_integer(max_chars) or max_chars < 1):
        raise ValueError(f"max_chars must be a positive int or None, got {max_chars!r}")
    lm, masks = context.lm, context.lm.masks
    last = lm.vocab[context.tokens[-1]][-1:] if context.tokens else ""
    start = masks.CONTINUES_CURRENT_WORD if last in _NO_SPACE_NEEDED else masks.STARTS_NEW_WORD
    cont = masks.CONTINUES_CURRENT_WORD.tensor

    def fitting(mask, used):
        if max_chars is None:
            return mask.tensor if hasattr(mask, "tensor") else mask
        m = mask.tensor if hasattr(mask, "tensor") else mask
        return m & masks.token_length_mask(max=max_chars - used).tensor

    await self.observe(context.mask_dist(fitting(start, 0)), True)
    word = lm.vocab[int(await self.sample(context.next_token()))]
    while True:
        more = fitting(cont, len(word.strip()))
        if not bool(more.any()):
            break
        if not await self.sample(context.mask_dist(more)):
            break
        word += lm.vocab[int(await self.sample(context.next_token()))]
    punct = torch.zeros_like(cont)
    if allow_mid_punctuation:
        punct = punct | masks.MID_PUNCTUATION.tensor
    if allow_end_punctuation:
        punct = punct | masks.END_SENTENCE_PUNCT.tensor
    punctuation = ""
    if bool(punct.any()) and await self.sample(context.mask_dist(punct)):
        punctuation = lm.vocab[int(await self.sample(context.next_token()))]
    return word, punctuation
