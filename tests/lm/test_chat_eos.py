"""Chat prompts (``LMContext(lm, messages=...)``) and end-of-sequence sets (``lm.eos_token_ids``)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from llamppl import FunctionLM, LMContext, run
from llamppl.decoding.text.characters import banned_words, max_word_length, regex_prefix
from llamppl.inference import enumerate_exact
from llamppl.lm.hf_vocab import eos_ids
from llamppl.models.hard_constraints import HardConstraint
from llamppl.models.infilling import Infilling

# Two end tokens: "<e1>" (the primary EOS) and "<e2>" (an end-of-turn token).
VOCAB = ["x", "y", " ", "<e1>", "<e2>"]
E1, E2 = 3, 4


def _logits(ctx: tuple[int, ...]) -> list[float]:
    n = len(ctx)
    return [0.3 * n, -0.2 * n, 0.1, 0.5 - 0.1 * n, 0.2 * n - 0.4]


LM = FunctionLM(VOCAB, E1, _logits, eos_token_ids=[E2])


def test_eos_token_ids_default_and_extra():
    assert FunctionLM(VOCAB, E1, _logits).eos_token_ids == {E1}
    assert LM.eos_token_ids == {E1, E2} and LM.eos_token_id == E1
    with pytest.raises(ValueError, match="eos_token_ids"):
        FunctionLM(VOCAB, E1, _logits, eos_token_ids=[9])


@pytest.mark.parametrize("end", [E1, E2])
def test_context_finishes_on_every_end_token(end):
    ctx = LMContext(LM, [0])
    assert not ctx.finished
    ctx.extend(end)
    assert ctx.finished


@pytest.mark.parametrize(
    "constraint", [max_word_length(1), banned_words(["yy"]), regex_prefix(r"[xy ]*")]
)
def test_constraint_masks_treat_every_end_token_as_end(constraint):
    mask = constraint.allowed_mask(LM, "x y")
    assert bool(mask[E1]) == bool(mask[E2]) == bool(constraint.accepts_end("x y"))


def test_infilling_end_probability_sums_every_end_token():
    # Z = Σ_h p(h | x) p(y | x h) P(end | x h y), h ∈ {(), (x), (y), ( )}: enumerated by hand.
    def p(ctx, tok):
        return math.exp(float(LM.logprobs(ctx)[tok]))

    z = 0.0
    for hole in [(), (0,), (1,), (2,)]:
        ctx = (0, *hole)
        end = p((*ctx, 1), E1) + p((*ctx, 1), E2)
        z += math.prod(p((0, *hole[:i]), t) for i, t in enumerate(hole)) * p(ctx, 1) * end
    exact = run(enumerate_exact(Infilling(LM, ["x", "y"], max_hole_tokens=1)))
    assert exact.log_ml == pytest.approx(math.log(z), abs=1e-10)


@pytest.mark.parametrize("proposal", ["mask", "sample"])
def test_hard_constraint_ends_on_every_end_token(proposal):
    # Z = Σ over token paths of ∏ p(t) · 1[text stays in C]; a path stops at <e1> or <e2>
    # (allowed iff C accepts the text) or after 3 tokens.
    constraint = max_word_length(1)

    def z(ctx: tuple[int, ...], text: str) -> float:
        if len(ctx) == 4:
            return 1.0
        total = 0.0
        for t, lp in enumerate(LM.logprobs(ctx).tolist()):
            if t in (E1, E2):
                total += math.exp(lp) * constraint.accepts_end(text)
            elif constraint(text + VOCAB[t]):
                total += math.exp(lp) * z((*ctx, t), text + VOCAB[t])
        return total

    model = HardConstraint(LM, [0], constraint, proposal=proposal, max_tokens=3)
    exact = run(enumerate_exact(model))
    assert exact.log_ml == pytest.approx(math.log(z((0,), "")), abs=1e-10)
    assert any(p.context.tokens[-1] == E2 and p.ending == "end token" for p in exact.particles)


def test_eos_ids_reads_generation_config_lists():
    tok = SimpleNamespace(eos_token_id=7)
    model = SimpleNamespace(
        generation_config=SimpleNamespace(eos_token_id=[5, 7, 99]),
        config=SimpleNamespace(eos_token_id=6),
    )
    assert eos_ids(tok, model, 10) == (7, frozenset({5, 6, 7}))  # 99 lies outside the vocab
    assert eos_ids(SimpleNamespace(eos_token_id=None), model, 10)[0] == 5
    with pytest.raises(ValueError, match="eos_token_id"):
        eos_ids(SimpleNamespace(), SimpleNamespace(config=SimpleNamespace()), 10)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({}, ValueError, "exactly one of prompt"),
        (
            {"prompt": [0], "messages": [{"role": "user", "content": "x"}]},
            ValueError,
            "exactly one",
        ),
        ({"messages": "hello"}, TypeError, "messages must be a list"),
        ({"messages": []}, ValueError, "at least one message"),
        ({"messages": [{"content": "x"}]}, TypeError, r"messages\[0\]"),
        ({"messages": [{"role": "user", "content": "x"}]}, TypeError, "no chat template"),
    ],
)
def test_bad_chat_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        LMContext(LM, **kwargs)


# --------------------------------------------------------------------------- embedded model
@pytest.mark.slow
def test_chat_context_is_the_templated_prompt_and_ends_with_im_end(smollm):
    messages = [{"role": "user", "content": "Say just the word yes."}]
    ctx = LMContext(smollm, messages=messages)
    text = smollm.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert ctx.tokens == smollm.tokenizer.encode(text, add_special_tokens=False)
    assert ctx.prompt.endswith("<|im_start|>assistant\n")
    im_end = smollm.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in smollm.eos_token_ids
    for _ in range(24):  # greedy reply: the model ends its turn with <|im_end|>
        ctx.extend(int(torch.argmax(smollm.next_token_logprobs_sync(ctx.tokens))))
        if ctx.finished:
            break
    assert ctx.finished and ctx.tokens[-1] == im_end, str(ctx)


@pytest.mark.slow
def test_generation_config_end_tokens_reach_the_lm(smollm):
    gen = smollm.model.generation_config
    saved = gen.eos_token_id
    try:
        gen.eos_token_id = [smollm.eos_token_id, 0]  # as Llama 3 lists <|eot_id|> and others
        from llamppl import CachedCausalLM

        lm = CachedCausalLM(smollm.model, smollm.tokenizer, max_cache_tokens=64)
    finally:
        gen.eos_token_id = saved
    assert lm.eos_token_id == smollm.eos_token_id and lm.eos_token_ids == {smollm.eos_token_id, 0}
