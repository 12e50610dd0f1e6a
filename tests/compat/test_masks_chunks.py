"""Vocabulary masks, combined ``mask_dist`` observations and ``sample_word`` on small exact programs."""

from __future__ import annotations

import math
import string

import numpy as np
import pytest
import torch

from inference import enumerate_exact, importance_sampling
from llamppl import FunctionLM, LMContext, Model, run, sample_word
from llamppl.chunks import sample_word_2

VOCAB = ["<eos>", " ab", " b", "a", "b", ".", ",", " "]


def logits(ctx):  # a fixed, context-dependent next-token distribution
    rng = np.random.default_rng(hash(ctx) % 2**32)
    return rng.normal(size=len(VOCAB)).tolist()


LM = FunctionLM(VOCAB, 0, logits)


def probs(ctx):
    return torch.softmax(torch.tensor(logits(tuple(ctx)), dtype=torch.float64), 0).tolist()


def test_masks_follow_their_definitions():
    m = LM.masks
    assert set(m.STARTS_NEW_WORD) == {1, 2}
    assert set(m.CONTINUES_CURRENT_WORD) == {3, 4}
    assert set(m.PUNCTUATION) == {5, 6}
    assert set(m.END_SENTENCE_PUNCT) == set(m.END_PUNCTUATION) == {5}
    assert set(m.MID_PUNCTUATION) == {6}
    assert set(m.CONTAINS_WHITESPACE) == {1, 2, 7}
    assert set(m.EOS) == {0} and len(m.ALL_TOKENS) == len(VOCAB)
    assert m.PUNCTUATION.tensor.tolist() == [i in (5, 6) for i in range(len(VOCAB))]
    assert LM.masks is LM.masks and m.PUNCTUATION is m.PUNCTUATION  # built once, cached
    with pytest.raises(AttributeError, match="NOT_A_MASK"):
        _ = m.NOT_A_MASK


def test_masks_on_the_embedded_tokenizer(smollm):
    m, vocab = smollm.masks, smollm.str_vocab
    assert smollm.eos_token_id not in m.PUNCTUATION and smollm.eos_token_id in m.EOS
    for name, ok in [
        ("STARTS_NEW_WORD", lambda t: t[0] == " " and t[1:].isalpha()),
        ("CONTINUES_CURRENT_WORD", str.isalpha),
        ("PUNCTUATION", lambda t: all(c in string.punctuation for c in t)),
    ]:
        ids = getattr(m, name)
        assert len(ids) > 100
        assert all(ok(vocab[i]) for i in list(ids)[:2000]), name
    assert smollm.encode(" house")[0] in m.STARTS_NEW_WORD


class TwoMasks(Model):
    def __init__(self):
        super().__init__()
        self.context = LMContext(LM, [7])

    async def step(self):
        await self.observe(self.context.mask_dist({1, 2, 3, 5}), True)
        await self.observe(self.context.mask_dist({2, 3, 4}), True)
        self.token = int(await self.sample(self.context.next_token()))
        self.finish()


def test_successive_mask_observations_combine():
    p = probs([7])
    result = run(enumerate_exact(TwoMasks()))
    # P(A) · P(B | A) = P(A ∩ B), and the token is drawn from the LM restricted to A ∩ B = {2, 3}.
    assert result.log_ml == pytest.approx(math.log(p[2] + p[3]), abs=1e-9)
    post = {q.token: w for q, w in zip(result.particles, result.weights)}
    ctx = LMContext(LM, [7])
    assert ctx.model_mask == set(range(len(VOCAB)))
    run(ctx.mask_dist({1, 2, 3, 5}).log_prob(True))
    run(ctx.mask_dist({2, 3, 4}).log_prob(True))
    assert ctx.model_mask == {2, 3}  # LLaMPPL's name for the pending mask
    assert post == pytest.approx({2: p[2] / (p[2] + p[3]), 3: p[3] / (p[2] + p[3])}, abs=1e-9)


class Words(Model):
    def __init__(self, n_words=2):
        super().__init__()
        self.context = LMContext(LM, [7])
        self.words, self.n_words = [], n_words

    async def step(self):
        word, punct = await self.call(sample_word(self.context, max_tokens=2))
        self.words.append(word + punct)
        if len(self.words) == self.n_words:
            self.finish()


def test_sample_word_output_and_unbiased_z():
    exact = run(enumerate_exact(Words()))
    assert exact.log_ml > -math.inf
    for p in exact.particles:
        first, second = p.words
        assert first[0] not in " " and second[0] == " "  # the prompt ends in a space
        for w in p.words:
            body = w.rstrip(".,")
            assert 1 <= len([c for c in body if c.isalpha()]) and len(w) - len(body) <= 1
    zs = np.array(
        [math.exp(run(importance_sampling(Words(), 3, seed=s)).log_ml) for s in range(200)]
    )
    se = zs.std(ddof=1) / math.sqrt(zs.size)
    assert abs(zs.mean() - math.exp(exact.log_ml)) < 4 * se


class Words2(Model):
    def __init__(self):
        super().__init__()
        self.context = LMContext(LM, [7])
        self.words = []

    async def step(self):
        word, punct = await self.call(sample_word_2(self.context, max_chars=2))
        self.words.append((word.strip(), punct))
        if len(self.words) == 2:
            self.finish()


def test_sample_word_2_length_limit_and_unbiased_z():
    exact = run(enumerate_exact(Words2()))
    assert exact.log_ml > -math.inf and len(exact.particles) > 4
    for p in exact.particles:
        for word, punct in p.words:
            assert 1 <= len(word) <= 2 and word.isalpha() and punct in ("", ".", ",")
    assert LM.masks.token_length_mask(max=1) == {2, 3, 4, 5, 6, 7}  # " " strips to ""
    zs = np.array(
        [math.exp(run(importance_sampling(Words2(), 3, seed=s)).log_ml) for s in range(200)]
    )
    se = zs.std(ddof=1) / math.sqrt(zs.size)
    assert abs(zs.mean() - math.exp(exact.log_ml)) < 4 * se
