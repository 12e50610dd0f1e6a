"""ByteLM on FunctionLMs whose strings have several spellings: exact against brute force,
the beam's error falling with K, one batched token-LM call per round, programs over bytes."""

from __future__ import annotations

import asyncio
import itertools
import math

import pytest
import torch
from byte_programs import ambiguous_lm, brute_prefix_logprob, brute_string_probs, special_token_lm

from llamppl import ByteLM, LMContext, Model, run
from llamppl.inference import enumerate_exact
from llamppl.models import HardConstraint


def all_prefixes(max_len: int):
    for n in range(max_len + 1):
        for letters in itertools.product("ab", repeat=n):
            yield "".join(letters)


def test_exact_prefix_logprob_equals_brute_force_sum_over_tokenizations():
    lm = ambiguous_lm()
    byte_lm = ByteLM(lm, beam=None)

    async def go():
        return [(s, await byte_lm.prefix_logprob(s.encode())) for s in all_prefixes(4)]

    for s, got in run(go()):
        assert got == pytest.approx(brute_prefix_logprob(lm, s), abs=1e-9), s
    assert byte_lm.stats.extensions > 0


@pytest.mark.parametrize("make_lm", [ambiguous_lm, special_token_lm])
def test_next_byte_chain_is_the_prefix_probability_and_the_end_is_exact(make_lm):
    """Also with a byteless special token of varying mass: the chain of next-byte probabilities,
    ``prefix_logprob`` and the brute-force sum are one distribution, the token LM renormalised
    over the tokens with bytes at every boundary (dropping its mass only in the next-byte
    normalisation made them differ)."""
    lm = make_lm()
    byte_lm = ByteLM(lm, beam=None)
    strings = brute_string_probs(lm, 3)

    async def go():
        for s in all_prefixes(3):
            chain = 0.0
            for i in range(len(s)):
                chain += float((await byte_lm.next_byte_logprobs(s[:i].encode()))[ord(s[i])])
            assert chain == pytest.approx(brute_prefix_logprob(lm, s), abs=1e-9), s
            assert chain == pytest.approx(await byte_lm.prefix_logprob(s.encode()), abs=1e-9), s
            # P(text = s exactly) = P(s) P(end | s)
            end = float((await byte_lm.next_byte_logprobs(s.encode()))[256])
            assert chain + end == pytest.approx(math.log(strings[s]), abs=1e-9), s

    run(go())


def test_distribution_is_normalised_and_impossible_prefixes_are_minus_inf():
    byte_lm = ByteLM(ambiguous_lm(), beam=None)
    lp = run(byte_lm.next_byte_logprobs(b"ab"))
    assert lp.shape == (257,)
    assert float(torch.logsumexp(lp, 0)) == pytest.approx(0.0, abs=1e-12)
    assert float(lp[ord("c")]) == -math.inf
    dead = run(byte_lm.next_byte_logprobs(b"abc"))
    assert torch.all(dead == -math.inf) and not torch.isnan(dead).any()
    assert run(byte_lm.prefix_logprob("abc")) == -math.inf


def test_beam_error_falls_as_k_grows():
    lm = ambiguous_lm()
    exact = ByteLM(lm, beam=None)
    strings = [s for s in all_prefixes(5) if len(s) == 5]

    def error(byte_lm):
        async def go():
            worst = 0.0
            for s in strings:
                e = await exact.next_byte_logprobs(s.encode())
                b = await byte_lm.next_byte_logprobs(s.encode())
                # total variation of the next-byte distribution
                worst = max(worst, 0.5 * float((e.exp() - b.exp()).abs().sum()))
            return worst

        return run(go())

    errors = [error(ByteLM(lm, beam=k)) for k in (2, 4, 8, 64)]
    assert errors[-1] < 1e-12
    assert all(a >= b for a, b in zip(errors, errors[1:])), errors
    assert errors[0] > 1e-3, errors


def test_concurrent_prefixes_share_one_batched_call():
    lm = ambiguous_lm()
    byte_lm = ByteLM(lm, beam=None)
    run(byte_lm.next_byte_logprobs(b"a"))
    calls = lm.stats.batch_calls

    async def go():
        return await asyncio.gather(*(byte_lm.next_byte_logprobs(s) for s in (b"ab", b"aa", b"ab")))

    run(go())
    # the elements of both new coverings are requested in one coalesced call per round
    assert lm.stats.batch_calls - calls == 1
    assert byte_lm.stats.covering_hits >= 1


class ByteWords(Model):
    """Samples bytes after a prompt until the end or three bytes; no "bb" allowed."""

    def __init__(self, byte_lm, prompt):
        super().__init__()
        self.context = LMContext(byte_lm, prompt)

    async def step(self):
        byte = await self.sample(self.context.next_token())
        self.condition("bb" not in str(self.context))
        if int(byte) == 256 or len(self.context.generated) >= 3:
            self.finish()

    def string_for_serialization(self):
        return str(self.context) + ("$" if self.context.finished else "")


def test_a_program_over_bytes_has_the_exact_posterior():
    lm = ambiguous_lm()
    byte_lm = ByteLM(lm, beam=None)
    result = run(enumerate_exact(ByteWords(byte_lm, "a")))
    # brute force: every spelling of every text of at most 1 + 3 characters, then condition
    strings = brute_string_probs(lm, 4)
    start = math.exp(brute_prefix_logprob(lm, "a"))
    target: dict[str, float] = {}
    for text, p in strings.items():
        if text.startswith("a") and len(text) <= 3 and "bb" not in text[1:]:
            target[text[1:] + "$"] = p / start
    for rest in map("".join, itertools.product("ab", repeat=3)):  # cut after 3 bytes
        if "bb" not in rest:
            target[rest] = math.exp(brute_prefix_logprob(lm, "a" + rest)) / start
    z = sum(target.values())
    assert result.log_ml == pytest.approx(math.log(z), abs=1e-9)
    for key, p in target.items():
        assert result.posterior.get(key, 0.0) == pytest.approx(p / z, abs=1e-9), key
    assert set(result.posterior) <= set(target)


def test_hard_constraint_on_a_byte_lm_is_the_brute_force_posterior():
    lm = ambiguous_lm()
    byte_lm = ByteLM(lm, beam=None)
    model = HardConstraint(
        byte_lm,
        "b",
        lambda text: "aa" not in text,
        proposal="sample",
        max_tokens=4,
        truncated="drop",
    )
    result = run(enumerate_exact(model))
    strings = brute_string_probs(lm, 4)
    target = {t[1:]: p for t, p in strings.items() if t.startswith("b") and "aa" not in t[1:]}
    z = sum(target.values()) / math.exp(brute_prefix_logprob(lm, "b"))
    assert result.log_ml == pytest.approx(math.log(z), abs=1e-9)
    norm = sum(target.values())
    for text, p in target.items():
        assert result.posterior.get(text, 0.0) == pytest.approx(p / norm, abs=1e-9), text


def test_greedy_and_bad_input():
    byte_lm = ByteLM(ambiguous_lm(), beam=4)
    out = run(byte_lm.greedy("ab", max_bytes=3))
    assert isinstance(out, str) and len(out.encode()) <= 3
    with pytest.raises(ValueError, match="beam"):
        ByteLM(ambiguous_lm(), beam=0)
    with pytest.raises(TypeError, match="lm must be a token LM"):
        ByteLM(byte_lm)
    with pytest.raises(TypeError, match="prefix"):
        run(byte_lm.next_byte_logprobs(3.5))
    with pytest.raises(ValueError, match="end"):
        run(byte_lm.next_token_logprobs([97, 256]))


def test_character_constraints_mask_bytes_exactly():
    # max_word_length's cheap mask over the 257 byte "tokens" gives the sampling formulation's
    # posterior (each byte's text checked), on the byte LM's own distribution
    from llamppl.constraints import max_word_length

    lm = ambiguous_lm()
    results = [
        run(
            enumerate_exact(
                HardConstraint(
                    ByteLM(lm, beam=None), "b", max_word_length(2), proposal=p, max_tokens=4
                )
            )
        )
        for p in ("mask", "sample")
    ]
    assert results[0].log_ml == pytest.approx(results[1].log_ml, abs=1e-12)
    assert results[0].log_ml < 0
    for key, p in results[1].posterior.items():
        assert results[0].posterior.get(key, 0.0) == pytest.approx(p, abs=1e-12)
    assert all(len(w) <= 2 for key in results[0].posterior for w in key.split())


def test_an_empty_prompt_starts_right_after_the_context():
    # LMContext puts the start id (257) first: the bytes are the reply after ``context``
    lm = ambiguous_lm()
    byte_lm = ByteLM(lm, beam=None, context=[1])
    assert LMContext(byte_lm, "").tokens == [257]
    result = run(enumerate_exact(ByteWords(byte_lm, "")))
    target = {x + "$": p for x, p in brute_string_probs(lm, 2, context=(1,)).items()}
    for rest in map("".join, itertools.product("ab", repeat=3)):
        target[rest] = math.exp(brute_prefix_logprob(lm, rest, context=(1,)))
    target = {k: v for k, v in target.items() if "bb" not in k}
    z = sum(target.values())
    assert result.log_ml == pytest.approx(math.log(z), abs=1e-9)
    for key, p in target.items():
        assert result.posterior.get(key, 0.0) == pytest.approx(p / z, abs=1e-9), key
