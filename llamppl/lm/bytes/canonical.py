"""Canonical tokenizations: which token strings the tokenizer itself would write.

"Language Models over Canonical Byte-Pair Encodings" (Vieira et al., ICML 2025;
``papers.md`` §7). A token string t is *canonical* when it equals the tokenizer's encoding
of its own decoding, ``encode(decode(t)) == t``. An LM also gives mass to the other
spellings of each string (``" Par" + "is"`` for ``" Paris"``), which no training text
ever shows. For BPE, canonicity is local: t is canonical iff every adjacent pair
``(t_i, t_{i+1})`` is (the bigram test of the paper), so a prefix check needs only the
last token and the next one. A pre-tokenizer's look-ahead (the whitespace rule of GPT-2
style regexes) makes a pair's encoding depend on what follows, so :func:`canonical_pair`
asks whether the pair starts the encoding of its text followed by a character of some
class (:data:`FOLLOWERS`)::

    from llamppl.lm.bytes.canonical import canonical_pair, is_canonical, string_posterior
    canonical_pair(lm, lm.encode(" Par")[0], lm.encode("is")[0])   # False: " Paris" is one token
    is_canonical(lm, lm.encode("The capital"))                     # True

A pair whose bytes are not text on their own (part of a multi-byte character) is allowed
(the pair test never rejects what a canonical string may contain); the complete check
:func:`is_canonical` decides on the whole string. :func:`string_posterior` merges the
weights of the spellings of one string (the posterior over strings rather than token
strings), optionally keeping the canonical spellings only. The constraint that conditions
a program on canonicity is :func:`llamppl.constraints.canonical`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from ..base import LanguageModel
from ..memo import LRU, lm_table
from .covering import byte_tables

__all__ = ["FOLLOWERS", "canonical_pair", "is_canonical", "string_posterior"]


def _text(lm: LanguageModel, ids: Sequence[int]) -> str | None:
    """The text of ``ids`` from their bytes, or None when the bytes are not valid UTF-8."""
    tables = byte_tables(lm)
    try:
        return b"".join(tables.token_bytes[i] for i in ids).decode("utf-8")
    except UnicodeDecodeError:
        return None


#: What may follow a pair, one of each character class a pre-tokenizer tells apart (the end,
#: a letter, a digit, punctuation, a space, a newline): a pair is canonical when it starts the
#: encoding of its text followed by one of them.
FOLLOWERS = ("", "a", "1", ".", " ", "\n")


def canonical_pair(lm: LanguageModel, a: int, b: int) -> bool:
    """Whether the pair ``(a, b)`` is canonical: ``lm.encode`` of its text, followed by one of
    :data:`FOLLOWERS`, starts with ``[a, b]`` (remembered per LM).

    For BPE without a pre-tokenizer the followers change nothing (a canonical string's
    prefixes are canonical); they matter for regex pre-tokenizers, whose whitespace rule
    looks ahead (``"\\n"`` then ``"\\t"`` is how ``"\\n\\treturn"`` is encoded, while
    ``"\\n\\t"`` alone is one token). A pair that is not valid UTF-8 on its own is allowed.
    """
    memo = lm_table(lm, "bytes.canonical_pairs", lambda lm: LRU(1 << 18))
    key = (int(a), int(b))
    found = memo.get(key)
    if found is None:
        text = _text(lm, key)
        found = text is None or any(_starts(lm, text + f, key) for f in FOLLOWERS)
        memo.put(key, found)
    return found


def _starts(lm: LanguageModel, text: str, key: tuple[int, int]) -> bool:
    try:
        return tuple(lm.encode(text)[:2]) == key
    except ValueError:  # a follower the vocabulary cannot spell
        return False


def is_canonical(lm: LanguageModel, token_ids: Sequence[int]) -> bool:
    """Whether ``token_ids`` equals ``lm.encode`` of its text (the paper's definition); token
    strings whose bytes are not valid UTF-8 are not canonical (no text encodes to them)."""
    ids = [int(t) for t in token_ids]
    if not ids:
        return True
    text = _text(lm, ids)
    return text is not None and list(lm.encode(text)) == ids


def string_posterior(
    weighted: Iterable[tuple[Sequence[int], float]],
    lm: LanguageModel,
    canonical_only: bool = False,
) -> dict[str, float]:
    """The posterior over strings from weighted token strings: ``{text: probability}``.

    ``weighted`` holds ``(token ids, log weight)`` pairs (particles and their log weights, or
    exact paths and log probabilities). The spellings of one string are merged, P(x) ∝
    Σ_{t: decode(t) = x} w(t); with ``canonical_only`` the non-canonical spellings get weight
    0 first, which is the posterior of the LM conditioned on canonicity (the paper's
    "canonicality by conditioning"). End tokens are not part of the text. Every weight
    ``-inf`` gives ``{}``.
    """
    ends = set(lm.eos_token_ids)
    merged: dict[str, list[float]] = {}
    for ids, logw in weighted:
        ids = [int(t) for t in ids if int(t) not in ends]
        if logw == -math.inf or (canonical_only and not is_canonical(lm, ids)):
            continue
        if math.isnan(logw):
            raise ValueError("weighted must not hold NaN log weights")
        text = b"".join(byte_tables(lm).token_bytes[i] for i in ids).decode("utf-8", "replace")
        merged.setdefault(text, []).append(float(logw))
    if not merged:
        return {}
    sums = {k: _lse(v) for k, v in merged.items()}
    total = _lse(list(sums.values()))
    return {k: math.exp(v - total) for k, v in sorted(sums.items(), key=lambda kv: -kv[1])}


def _lse(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))
