"""FunctionLM: normalisation, -inf handling, encode/decode, bad input, request coalescing."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llamppl.lm.function_lm import FunctionLM

VOCAB = ["a", "b", "ab", " ", "<eos>"]


def make_lm(logits_fn=None) -> FunctionLM:
    return FunctionLM(
        VOCAB,
        eos_token_id=4,
        logits_fn=logits_fn or (lambda ctx: [0.5 * len(ctx), 1.0, -2.0, 0.0, 0.3]),
    )


def test_logprobs_are_normalised():
    lm = make_lm()
    for ctx in [(), (0,), (1, 2, 3)]:
        lp = asyncio.run(lm.next_token_logprobs(ctx))
        assert lp.shape == (5,)
        assert torch.logsumexp(lp, 0).item() == pytest.approx(0.0, abs=1e-12)


def test_minus_inf_logits_have_zero_probability_and_no_nan():
    lm = make_lm(lambda ctx: [0.0, -math.inf, 1.0, -math.inf, 2.0])
    lp = lm.next_token_logprobs_sync([0])
    assert not torch.isnan(lp).any()
    assert lp[1] == -math.inf and lp[3] == -math.inf
    assert lp.exp()[[1, 3]].sum() == 0
    assert torch.logsumexp(lp, 0).item() == pytest.approx(0.0, abs=1e-12)
    assert lm.sequence_logprob([], [1]) == -math.inf


@given(st.lists(st.sampled_from(VOCAB[:4]), max_size=20))
@settings(max_examples=100, deadline=None)
def test_encode_decode_round_trip(pieces):
    lm = make_lm()
    text = "".join(pieces)
    ids = lm.encode(text)
    assert lm.decode(ids) == text
    assert all(0 <= i < lm.vocab_size for i in ids)


@given(st.lists(st.integers(min_value=0, max_value=4), max_size=20))
@settings(max_examples=100, deadline=None)
def test_decode_is_concatenation(ids):
    lm = make_lm()
    assert lm.decode(ids) == "".join(VOCAB[i] for i in ids)


def test_encode_is_greedy_longest_match():
    assert make_lm().encode("abab a") == [2, 2, 3, 0]


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        ({"vocab": []}, ValueError, "vocab"),
        ({"vocab": "ab"}, ValueError, "vocab"),
        ({"vocab": ["a", ""]}, TypeError, "vocab"),
        ({"vocab": ["a", "a"]}, ValueError, "vocab"),
        ({"eos_token_id": 5}, ValueError, "eos_token_id"),
        ({"eos_token_id": -1}, ValueError, "eos_token_id"),
        ({"eos_token_id": 1.5}, TypeError, "eos_token_id"),
        ({"bos_token_id": 9}, ValueError, "bos_token_id"),
        ({"logits_fn": "not callable"}, TypeError, "logits_fn"),
    ],
)
def test_bad_constructor_arguments(kwargs, exc, name):
    args = {"vocab": VOCAB, "eos_token_id": 4, "logits_fn": lambda ctx: [0.0] * 5, **kwargs}
    with pytest.raises(exc, match=name):
        FunctionLM(**args)


def test_bad_token_ids():
    lm = make_lm()
    with pytest.raises(ValueError, match=r"token_ids\[1\]"):
        asyncio.run(lm.next_token_logprobs([0, 5]))
    with pytest.raises(ValueError, match="token_ids"):
        lm.next_token_logprobs_sync([-1])
    with pytest.raises(TypeError, match=r"token_ids\[0\]"):
        lm.next_token_logprobs_sync([0.0])
    with pytest.raises(TypeError, match="token_ids"):
        lm.next_token_logprobs_sync([True])
    with pytest.raises(TypeError, match="token_ids"):
        lm.next_token_logprobs_sync("ab")
    with pytest.raises(ValueError, match="token_ids"):
        lm.decode([7])
    with pytest.raises(TypeError, match="text"):
        lm.encode(3)
    with pytest.raises(ValueError, match="tokenised"):
        lm.encode("abc")


def test_bad_logits_fn_output():
    with pytest.raises(ValueError, match="logits"):
        make_lm(lambda ctx: [0.0, 1.0]).next_token_logprobs_sync([])
    with pytest.raises(ValueError, match="NaN"):
        make_lm(lambda ctx: [math.nan] * 5).next_token_logprobs_sync([])
    with pytest.raises(ValueError, match="finite"):
        make_lm(lambda ctx: [-math.inf] * 5).next_token_logprobs_sync([])


def test_sixteen_concurrent_awaits_are_one_batch():
    seen = []

    class Recording(FunctionLM):
        def next_token_logprobs_batch(self, contexts):
            seen.append(list(contexts))
            return super().next_token_logprobs_batch(contexts)

    lm = Recording(VOCAB, 4, lambda ctx: [0.0] * 5)

    async def go():
        return await asyncio.gather(*(lm.next_token_logprobs([0] * (i % 8)) for i in range(16)))

    outs = asyncio.run(go())
    assert lm.batch_calls == 1 and len(seen) == 1
    assert len(seen[0]) == 8  # duplicates are served once
    assert len(outs) == 16 and all(o.shape == (5,) for o in outs)


@pytest.mark.parametrize("name", ["next_token_logprobs_batch", "_next_token_logprobs_batch"])
def test_the_backend_hook_answers_to_its_public_and_its_earlier_name(name):
    # A subclass overriding either name (and calling super() by the same name) is the
    # one the base class calls, and both names reach that override.
    seen = []

    def hook(self, contexts):
        seen.append(list(contexts))
        return getattr(super(Hooked, self), name)(contexts)

    Hooked = type("Hooked", (FunctionLM,), {name: hook})
    lm = Hooked(VOCAB, 4, lambda ctx: [0.0, 1.0, 2.0, 3.0, 4.0])
    lm.batch_next_token_logprobs([[0], [1]])
    assert asyncio.run(lm.next_token_logprobs([2])).shape == (5,)
    lm.next_token_logprobs_batch([(3,)])
    lm._next_token_logprobs_batch([(4,)])
    assert seen == [[(0,), (1,)], [(2,)], [(3,)], [(4,)]]
    assert torch.equal(
        lm.next_token_logprobs_batch([(0,)])[0],
        make_lm(lambda c: [0, 1, 2, 3, 4]).next_token_logprobs_sync([0]),
    )


def test_a_backend_without_the_hook_names_it():
    from llamppl.lm.base import LanguageModel

    class NoHook(LanguageModel):
        vocab = ["a"]
        eos_token_id = 0

    with pytest.raises(
        NotImplementedError, match=r"NoHook must implement next_token_logprobs_batch"
    ):
        NoHook().batch_next_token_logprobs([[0]])


def test_backend_error_reaches_every_awaiter():
    lm = make_lm(lambda ctx: [math.nan] * 5)

    async def go():
        return await asyncio.gather(
            *(lm.next_token_logprobs([i]) for i in range(3)), return_exceptions=True
        )

    errs = asyncio.run(go())
    assert all(isinstance(e, ValueError) for e in errs)
