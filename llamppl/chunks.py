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

from .submodel import submodel

__all__ = ["sample_word"]

_NO_SPACE_NEEDED = ("", " ", "\n", "\t", "-", "'", '"', "(")


@submodel
async def sample_word(self, context, max_tokens: int = 5, allow_punctuation: bool = True):
    """Sample one word (and optional punctuation) from ``context``; returns ``(word, punctuation)``."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
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
