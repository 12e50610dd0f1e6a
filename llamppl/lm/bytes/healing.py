"""Token healing in the token view: back off the prompt's last token, and make the next tokens
spell it again.

A prompt that ends inside a word (``"The capital of France is Pa"``) is usually encoded
with a token (``" Pa"``) that the model rarely sees before ``"ris"``: the text it would
write is ``" Paris"``, one token. Healing removes the last prompt token and constrains the
generated tokens to *re-spell* its bytes R: a token is allowed while R is not yet covered
iff its bytes extend R (``" Paris"``) or are a proper prefix of R (``" P"``, then
``"a…"``). :class:`~llamppl.LMContext` (``heal=True``) uses it with exact weights: the
program observes ``context.heal_dist()`` (the Bernoulli "the next token is consistent",
P = the allowed mass, the token-masking formulation of the LLaMPPL paper §2.2) before each
token, so the target is the LM conditioned on "the text after the kept prompt tokens starts
with R", for every spelling of R that starts a new token where the kept tokens end::

    from llamppl.lm.bytes.healing import heal_prompt, consistent_mask, after_token
    kept, rest = heal_prompt(lm, lm.encode("The capital of France is Pa"))   # rest = b" Pa"
    mask = consistent_mask(lm, rest)            # (V,) bool: " Paris", " Pa", " P", ...
    after_token(lm, rest, lm.encode(" P")[0])   # b"a": still to spell

The byte view (:class:`~llamppl.lm.bytes.ByteLM`) heals every prompt by construction: it
conditions on the prompt's bytes under every tokenization at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..base import LanguageModel
from ..memo import LRU, lm_table
from .covering import byte_tables

__all__ = ["after_token", "consistent_mask", "heal_prompt"]


def heal_prompt(lm: LanguageModel, token_ids: Sequence[int]) -> tuple[list[int], bytes]:
    """``(kept ids, bytes to re-spell)``: ``token_ids`` without its last token, and that
    token's bytes. A prompt of one token that is the BOS, or an end or special token last,
    is kept whole (``b""``: nothing to heal)."""
    ids = list(token_ids)
    if not ids:
        return ids, b""
    tables = byte_tables(lm)
    last = ids[-1]
    if tables.bins_host[last] > 255:  # an end token or a token outside the text
        return ids, b""
    return ids[:-1], tables.token_bytes[last]


def consistent_mask(lm: LanguageModel, rest: bytes) -> torch.Tensor:
    """``(V,)`` bool on ``lm.device``: the text tokens whose bytes extend ``rest`` or are a
    non-empty proper prefix of it (end and special tokens: False). Remembered per LM."""
    memo = lm_table(lm, "bytes.consistent_masks", lambda lm: LRU(256))
    found = memo.get(rest)
    if found is not None:
        return found
    if not rest:
        raise ValueError("rest must be non-empty bytes: there is nothing left to heal")
    tables = byte_tables(lm)
    longer, _ = tables.node(rest)  # the tokens that strictly extend rest
    ids = [i for k in range(1, len(rest) + 1) for i in tables.by_bytes.get(rest[:k], ())]
    mask = torch.zeros(lm.vocab_size, dtype=torch.bool, device=lm.device)
    mask[longer] = True
    mask[torch.tensor(ids, dtype=torch.long, device=lm.device)] = True
    memo.put(rest, mask)
    return mask


def after_token(lm: LanguageModel, rest: bytes, token: int) -> bytes | None:
    """The bytes still to re-spell after ``token``: ``b""`` once a token extends ``rest``,
    the tail of ``rest`` after a token that is a prefix of it, None for an inconsistent token."""
    tables = byte_tables(lm)
    b = tables.token_bytes[int(token)]
    if not b or tables.bins_host[int(token)] > 255:
        return None
    if b.startswith(rest):
        return b""
    if rest.startswith(b):
        return rest[len(b) :]
    return None
