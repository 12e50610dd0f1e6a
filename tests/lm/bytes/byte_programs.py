"""Small FunctionLMs whose strings have several tokenizations, and brute-force sums over them."""

from __future__ import annotations

import math
from collections import defaultdict

from llamppl import FunctionLM

VOCAB = ["a", "b", "ab", "ba", "aba", "bb", "."]
EOS = 6


def _logits(ctx: tuple[int, ...]) -> list[float]:
    last = ctx[-1] if ctx else 0
    return [
        0.3 * math.sin(1.7 * i + len(ctx) + 0.9 * last)
        + (0.4 if i == EOS and len(ctx) > 1 else 0.0)
        for i in range(len(VOCAB))
    ]


def ambiguous_lm() -> FunctionLM:
    """Seven tokens over the letters a and b: "aba" has four spellings."""
    return FunctionLM(VOCAB, EOS, _logits)


#: ambiguous_lm's vocabulary and a special token (id 7), not an end token
SPECIAL_VOCAB = [*VOCAB, "<|special|>"]


class SpecialTokenLM(FunctionLM):
    """A FunctionLM whose special token appends no bytes (as a tokenizer's control tokens)."""

    @property
    def byte_vocab(self) -> list[bytes]:
        return [b"" if v == "<|special|>" else v.encode() for v in self.vocab]


def _special_logits(ctx: tuple[int, ...]) -> list[float]:
    return _logits(ctx) + [0.8 * math.cos(len(ctx) + (ctx[-1] if ctx else 0)) - 0.5]


def special_token_lm() -> FunctionLM:
    """ambiguous_lm plus a byteless special token whose probability varies with the context
    (0.03 to 0.16): the byte view renormalises the other tokens at every boundary."""
    return SpecialTokenLM(SPECIAL_VOCAB, EOS, _special_logits)


def _text_row(lm: FunctionLM, ctx: tuple[int, ...]) -> list[float]:
    """log p̃(· | ctx): the next-token log-probs renormalised over the tokens that carry bytes
    and the end (a byteless non-end token is never drawn in the byte view)."""
    row = [float(v) for v in lm.logprobs(ctx)]
    keep = [i for i in range(lm.vocab_size) if lm.byte_vocab[i] or i in lm.eos_token_ids]
    norm = math.log(sum(math.exp(row[i]) for i in keep))
    return [row[i] - norm if i in keep else -math.inf for i in range(lm.vocab_size)]


def brute_prefix_logprob(lm: FunctionLM, sigma: str, context: tuple[int, ...] = ()) -> float:
    """log Σ p̃(t) over every token string t that covers ``sigma`` (its text starts with sigma,
    the text before its last token is a proper prefix of sigma), by depth-first enumeration;
    p̃ is p renormalised over the tokens with bytes and the end (``_text_row``)."""
    if not sigma:
        return 0.0
    total = 0.0
    text_ids = [i for i in range(lm.vocab_size) if i not in lm.eos_token_ids and lm.byte_vocab[i]]

    def dfs(ctx: tuple[int, ...], text: str, logp: float) -> None:
        nonlocal total
        row = _text_row(lm, ctx)
        for w in text_ids:
            longer = text + lm.vocab[w]
            if longer.startswith(sigma):
                total += math.exp(logp + float(row[w]))
            elif sigma.startswith(longer):
                dfs(ctx + (w,), longer, logp + float(row[w]))

    dfs(context, "", 0.0)
    return math.log(total) if total > 0 else -math.inf


def brute_string_probs(
    lm: FunctionLM, max_chars: int, context: tuple[int, ...] = ()
) -> dict[str, float]:
    """P(the text is exactly x, then the end) for every x of at most ``max_chars`` characters:
    Σ over the spellings t of x of p̃(t) p̃(EOS | t)."""
    out: dict[str, float] = defaultdict(float)
    text_ids = [i for i in range(lm.vocab_size) if i not in lm.eos_token_ids and lm.byte_vocab[i]]

    def dfs(ctx: tuple[int, ...], text: str, logp: float) -> None:
        row = _text_row(lm, ctx)
        out[text] += math.exp(logp + float(row[EOS]))
        for w in text_ids:
            if len(text) + len(lm.vocab[w]) <= max_chars:
                dfs(ctx + (w,), text + lm.vocab[w], logp + float(row[w]))

    dfs(context, "", 0.0)
    return dict(out)
