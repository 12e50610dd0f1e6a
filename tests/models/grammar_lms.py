"""Shared test LM for the grammar tests: an exact FunctionLM with uneven, context-dependent logits."""

from __future__ import annotations

import math


def wavy_logits(n_vocab: int):
    """Logits over ``n_vocab`` tokens (last = EOS) that vary with length and last token; BOS never drawn."""
    eos = n_vocab - 1

    def logits(ctx):
        n, last = len(ctx), ctx[-1]
        out = [math.sin(1.3 * i + 0.7 * n + 0.4 * last) for i in range(eos)]
        out[0] = -math.inf  # BOS is never generated
        return out + [-0.8 + 0.4 * n]

    return logits
