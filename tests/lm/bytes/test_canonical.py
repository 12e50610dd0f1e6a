"""Canonical tokenizations on a toy BPE: the pair test is exact on prefixes, the constraint's
posterior is the LM conditioned on canonicity, and spellings merge into one string."""

from __future__ import annotations

import itertools
import math

import pytest

from llamppl import FunctionLM, run
from llamppl.constraints import canonical
from llamppl.inference import enumerate_exact
from llamppl.lm.bytes.canonical import canonical_pair, is_canonical, string_posterior
from llamppl.models import HardConstraint

MERGES = [("a", "b"), ("b", "b"), ("ab", "a"), ("b", "a")]  # by rank


class BPELM(FunctionLM):
    """A FunctionLM whose ``encode`` is byte-pair encoding with ``MERGES``."""

    def encode(self, text: str) -> list[int]:
        parts = list(text)
        while True:
            ranked = [
                (MERGES.index((x, y)), i)
                for i, (x, y) in enumerate(zip(parts, parts[1:]))
                if (x, y) in MERGES
            ]
            if not ranked:
                return [self.vocab.index(p) for p in parts]
            rank = min(ranked)[0]
            x, y = MERGES[rank]
            out, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == (x, y):
                    out.append(x + y)
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            parts = out


VOCAB = ["a", "b", "ab", "bb", "aba", "ba", "."]
EOS = 6


def bpe_lm() -> BPELM:
    return BPELM(VOCAB, EOS, lambda ctx: [0.2 * ((len(ctx) * 7 + i * 3) % 5) for i in range(7)])


def test_pair_test_is_exact_on_prefixes_of_a_bpe():
    lm = bpe_lm()
    for n in range(1, 5):
        for t in itertools.product(range(6), repeat=n):
            pairs = all(canonical_pair(lm, a, b) for a, b in zip(t, t[1:]))
            assert pairs == is_canonical(lm, t), [lm.vocab[i] for i in t]
    assert not canonical_pair(lm, VOCAB.index("a"), VOCAB.index("b"))  # "ab" is one token
    assert canonical_pair(lm, VOCAB.index("ab"), VOCAB.index("b"))


def brute_canonical(lm, max_tokens):
    """{token path (end included): p(path)} over the canonical paths of at most max_tokens."""
    out = {}

    def dfs(path, logp):
        row = lm.logprobs(path)
        if is_canonical(lm, path):
            out[path + (EOS,)] = math.exp(logp + float(row[EOS]))
        if len(path) + 1 < max_tokens:
            for w in range(6):
                dfs(path + (w,), logp + float(row[w]))

    dfs((), 0.0)
    return out


def test_canonical_constraint_posterior_is_the_lm_conditioned_on_canonicity():
    lm = bpe_lm()
    model = HardConstraint(
        lm, [1], canonical(after=[1]), proposal="sample", max_tokens=4, truncated="drop"
    )
    result = run(enumerate_exact(model))
    # brute force from the prompt's context: the prompt's last token pairs with the first one
    target = {}

    def dfs(path, logp):
        row = lm.logprobs((1,) + path)
        if is_canonical(lm, (1,) + path):
            target[lm.decode(list(path))] = target.get(lm.decode(list(path)), 0.0) + math.exp(
                logp + float(row[EOS])
            )
        if len(path) + 1 < 4:
            for w in range(6):
                dfs(path + (w,), logp + float(row[w]))

    dfs((), 0.0)
    z = sum(target.values())
    assert result.log_ml == pytest.approx(math.log(z), abs=1e-9)
    for text, p in target.items():
        assert result.posterior.get(text, 0.0) == pytest.approx(p / z, abs=1e-9), text


def test_string_posterior_merges_spellings():
    lm = bpe_lm()
    paths = brute_canonical(lm, 4)
    every = {}

    def dfs(path, logp):
        row = lm.logprobs(path)
        every[path + (EOS,)] = logp + float(row[EOS])
        if len(path) + 1 < 4:
            for w in range(6):
                dfs(path + (w,), logp + float(row[w]))

    dfs((), 0.0)
    merged = string_posterior(every.items(), lm)
    strings = brute_string_probs_bpe(lm)
    z = sum(strings.values())
    for text, p in strings.items():
        assert merged[text] == pytest.approx(p / z, abs=1e-12)
    only = string_posterior(every.items(), lm, canonical_only=True)
    zc = sum(paths.values())
    for path, p in paths.items():
        assert only[lm.decode(list(path[:-1]))] == pytest.approx(p / zc, abs=1e-12)
    assert string_posterior([([0], -math.inf)], lm) == {}


def brute_string_probs_bpe(lm):
    out = {}

    def dfs(path, logp):
        row = lm.logprobs(path)
        text = lm.decode(list(path))
        out[text] = out.get(text, 0.0) + math.exp(logp + float(row[EOS]))
        if len(path) + 1 < 4:
            for w in range(6):
                dfs(path + (w,), logp + float(row[w]))

    dfs((), 0.0)
    return out
