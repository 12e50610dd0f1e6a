"""LLaMPPL names accepted alongside ours: top-level imports, aliases, LMContext keywords, resampling adapter."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

import llamppl
from inference import enumerate_exact
from llamppl import FunctionLM, LMContext, LogCategorical, Model, Token, Transformer, run
from llamppl.inference.resampling import RESAMPLING_METHODS, get_resampling_fn, systematic

LM = FunctionLM(["<eos>", "a", "b", "ab"], 0, lambda ctx: [0.0, 1.0, 0.5, -1.0], bos_token_id=0)


def test_top_level_inference_names_are_lazy_reexports():
    from llamppl.inference import smc_standard, smc_steer

    assert llamppl.smc_standard is smc_standard and llamppl.smc_steer is smc_steer
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = llamppl.no_such_name


def test_token_text_logcategorical_transformer_text():
    assert Token(LM, 3) == "ab" and Token(LM, 3) != "a" and Token(LM, 3) == 3
    d = LogCategorical([0.0, math.log(3.0)])
    assert run(d.log_prob(1)) == pytest.approx(math.log(0.75))
    assert Transformer(LM, "ab").prompt == (0, 3)  # text is encoded, BOS first (as LMContext)


def test_lmcontext_keywords():
    ctx = asyncio.run(LMContext.create(LM, "a", 1.0, show_prompt=True, show_eos=False))
    assert ctx.token_count == 0
    ctx.extend(2)
    ctx.extend(0)
    assert ctx.token_count == 2 and str(ctx) == LM.decode([0, 1, 2])
    assert str(LMContext(LM, "a")) == ""


class ThreeTokens(Model):
    def __init__(self):
        super().__init__()
        self.context = LMContext(LM, "a")

    async def step(self):
        self.ids = await self.call(self.context.next_tokens(3))
        self.finish()


def test_next_tokens_submodel_is_exact():
    result = run(enumerate_exact(ThreeTokens()))
    assert result.log_ml == pytest.approx(0.0, abs=1e-12)  # no observations: Z = 1
    lp = np.log(np.exp([0.0, 1.0, 0.5, -1.0]) / np.exp([0.0, 1.0, 0.5, -1.0]).sum())
    best = max(zip(result.particles, result.log_weights), key=lambda pw: pw[1])
    assert best[0].ids == [1, 1, 1] and best[1] == pytest.approx(3 * lp[1])


def test_resampling_adapter():
    w = np.array([0.1, 0.6, 0.3])
    fn = get_resampling_fn("systematic")
    assert fn is RESAMPLING_METHODS["systematic"]
    np.random.seed(3)
    first = fn(w)
    np.random.seed(3)
    assert (fn(w) == first).all() and len(first) == 3  # driven by np.random.seed, like LLaMPPL
    assert set(np.unique(fn(np.array([0.0, 1.0, 0.0])))) == {1}
    assert systematic(np.log(w), np.random.default_rng(0)).shape == (3,)
    with pytest.raises(ValueError, match="bogus"):
        get_resampling_fn("bogus")


def test_lm_sync_aliases():
    ids = [0, 1, 2]
    assert (LM.next_token_logprobs_unbatched(ids) == LM.next_token_logprobs_sync(ids)).all()
    calls = LM.batch_calls
    LM.cache_kv([0, 3])
    assert LM.batch_calls == calls + 1
