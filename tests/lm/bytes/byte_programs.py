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


def brute_prefix_logprob(lm: FunctionLM, sigma: str, context: tuple[int, ...] = ()) -> float:
    """log Σ p(t) over every token string t that covers ``sigma`` (its text starts with sigma,
    the text before its last token is a proper prefix of sigma), by depth-first enumeration."""
    if not sigma:
        return 0.0
    total = 0.0
    text_ids = [i for i in range(lm.vocab_size) if i not in lm.eos_token_ids]

    def dfs(ctx: tuple[int, ...], text: str, logp: float) -> None:
        nonlocal total
        row = lm.logprobs(ctx)
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
    Σ over the spellings t of x of p(t) p(EOS | t)."""
    out: dict[str, float] = defaultdict(float)
    text_ids = [i for i in range(lm.vocab_size) if i not in lm.eos_token_ids]

    def dfs(ctx: tuple[int, ...], text: str, logp: float) -> None:
        row = lm.logprobs(ctx)
        out[text] += math.exp(logp + float(row[EOS]))
        for w in text_ids:
            if len(text) + len(lm.vocab[w]) <= max_chars:
                dfs(ctx + (w,), text + lm.vocab[w], logp + float(row[w]))

    dfs(context, "", 0.0)
    return dict(out)
