"""Shared pieces of the grammar tests: an exact FunctionLM with uneven, context-dependent
logits, and the brute-force conditional every grammar program is checked against."""

from __future__ import annotations

import math

import numpy as np

from llamppl import FunctionLM, run
from llamppl.inference import enumerate_exact


def wavy_logits(n_vocab: int):
    """Logits over ``n_vocab`` tokens (last = EOS) that vary with length and last token; BOS never drawn."""
    eos = n_vocab - 1

    def logits(ctx):
        n, last = len(ctx), ctx[-1]
        out = [math.sin(1.3 * i + 0.7 * n + 0.4 * last) for i in range(eos)]
        out[0] = -math.inf  # BOS is never generated
        return out + [-0.8 + 0.4 * n]

    return logits


def wavy_lm(vocab: list[str]) -> FunctionLM:
    """The FunctionLM of :func:`wavy_logits` over ``vocab`` (BOS first, EOS last)."""
    return FunctionLM(vocab, len(vocab) - 1, wavy_logits(len(vocab)), bos_token_id=0)


def brute_force(vocab, in_language, max_tokens, lm_fn=None):
    """log Z and p(y | y ∈ L) keyed by text, summing p(seq EOS) over EVERY token sequence of
    fewer than ``max_tokens`` tokens (depth-first, float64, from the logits function directly;
    ``lm_fn`` defaults to :func:`wavy_logits`)."""
    eos = len(vocab) - 1
    lm_fn = lm_fn or wavy_logits(len(vocab))
    acc: dict[str, float] = {}

    def visit(ctx, text, logp):
        z = np.array(lm_fn(tuple(ctx)), dtype=np.float64)
        lp = z - np.logaddexp.reduce(z)
        if in_language(text):
            acc[text] = acc.get(text, 0.0) + math.exp(logp + lp[eos])
        if len(ctx) < max_tokens:  # ctx holds BOS + generated tokens
            for t in range(1, eos):
                visit(ctx + [t], text + vocab[t], logp + lp[t])

    visit([0], "", 0.0)
    Z = sum(acc.values())
    return math.log(Z), {t: p / Z for t, p in acc.items()}


def assert_exact(model, log_z: float, post: dict[str, float]) -> None:
    """``enumerate_exact(model)`` equals the brute-force ``log_z`` and posterior."""
    exact = run(enumerate_exact(model))
    assert abs(exact.log_ml - log_z) <= 1e-9, (exact.log_ml, log_z)
    assert set(exact.posterior) == set(post)
    for text, p in post.items():
        assert abs(exact.posterior[text] - p) <= max(1e-9 * p, 1e-15), (
            text,
            exact.posterior[text],
            p,
        )
