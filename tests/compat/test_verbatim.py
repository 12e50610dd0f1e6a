"""The LLaMPPL / hfppl surface that programs use verbatim, on small exact FunctionLM programs.

Positional engine arguments in LLaMPPL's order, ``lm.backend`` and ``lm.batch_size``,
the old module paths (``llamppl.llms``, ``llamppl.distributions.*``), the ``hfppl``
alias, ``clear_kv_cache``, ``SMCResult`` as a list, ``model_mask`` and impossible masks.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import math

import numpy as np
import pytest
import torch

from llamppl import FunctionLM, LMContext, Model, run
from llamppl.inference import enumerate_exact, smc_standard, smc_steer

VOCAB = ["a", "b", "c", "<eos>"]


def _logits(ctx):
    return [1.0, 0.5, -0.5, 0.0 if len(ctx) >= 3 else -2.0]


def make_lm():
    return FunctionLM(VOCAB, eos_token_id=3, logits_fn=_logits)


class TwoTokens(Model):
    def __init__(self, lm):
        super().__init__()
        self.context = LMContext(lm, [0])
        self.n = 0

    async def step(self):
        await self.observe(self.context.mask_dist({2}), False)  # never "c"
        await self.sample(self.context.next_token())
        self.n += 1
        if self.n == 2:
            self.finish()


def test_smc_standard_positional_order_is_llamppls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # smc_standard(model, n_particles, ess_threshold, visualization_dir, json_file, resampling_method)
    res = asyncio.run(smc_standard(TwoTokens(make_lm()), 4, 0.5, "html", "out.json", "stratified"))
    assert len(res) == 4
    assert json.loads((tmp_path / "out.json").read_text())["algorithm"] == "smc_standard"
    assert (tmp_path / "html" / "record.json").exists()
    with pytest.raises(TypeError):  # our options stay keywords
        asyncio.run(smc_steer(TwoTokens(make_lm()), 2, 2, 0))


def test_positional_run_has_the_exact_posterior_support():
    exact = run(enumerate_exact(TwoTokens(make_lm())))
    res = run(smc_standard(TwoTokens(make_lm()), 8, 0.5, None, None, "multinomial", seed=0))
    assert set(res.posterior) <= set(exact.posterior)
    assert all("c" not in k for k in exact.posterior)


def test_backend_names_and_the_llamppl_guard():
    lm = make_lm()
    assert lm.backend == "function"
    from llamppl import VLLMLM, CachedCausalLM

    assert CachedCausalLM.backend == "hf" and VLLMLM.backend == "vllm"
    if lm.backend == "hf":  # the peers' examples, verbatim
        lm.batch_size = 40
    assert lm.batch_size is None


def test_batch_size_caps_contexts_per_backend_call():
    lm = make_lm()
    contexts = [[0] * i + [1] for i in range(1, 8)]  # 7 distinct contexts

    async def all_at_once():
        return await asyncio.gather(*(lm.next_token_logprobs(c) for c in contexts))

    whole = asyncio.run(all_at_once())
    assert lm.batch_calls == 1
    lm.batch_size = 3
    lm.stats.reset()
    split = asyncio.run(all_at_once())
    assert lm.batch_calls == 3  # ceil(7 / 3) calls of at most 3 contexts
    assert all(torch.equal(a, b) for a, b in zip(whole, split))
    lm.batch_size = None
    with pytest.raises(ValueError, match="batch_size"):
        lm.batch_size = 0
    with pytest.raises(TypeError, match="batch_size"):
        lm.batch_size = "40"


def test_old_module_paths_are_the_same_objects():
    import llamppl

    llms = importlib.import_module("llamppl.llms")
    assert llms.CachedCausalLM is llamppl.CachedCausalLM and llms.MLX_AVAILABLE is False
    from llamppl.distributions import LMContext as DistLMContext

    assert DistLMContext is llamppl.LMContext
    for module, name in [
        ("lmcontext", "LMContext"),
        ("transformer", "Transformer"),
        ("tokencategorical", "TokenCategorical"),
        ("bernoulli", "Bernoulli"),
        ("geometric", "Geometric"),
        ("logcategorical", "LogCategorical"),
        ("distribution", "Distribution"),
    ]:
        mod = importlib.import_module(f"llamppl.distributions.{module}")
        assert getattr(mod, name) is getattr(llamppl, name), module
    assert llamppl.CachedTransformer is llamppl.CachedCausalLM


def test_hfppl_is_an_alias_of_llamppl():
    import hfppl
    import llamppl
    from hfppl import Model as HModel
    from hfppl import smc_standard as h_smc
    from hfppl.distributions.lmcontext import LMContext as HLMContext
    from hfppl.inference import smc_steer as h_steer
    from hfppl.llms import CachedCausalLM as HLM

    assert HModel is llamppl.Model and HLMContext is llamppl.LMContext
    assert h_smc is smc_standard and h_steer is smc_steer and HLM is llamppl.CachedCausalLM
    assert hfppl.__version__ == llamppl.__version__
    # the shared modules keep their own identity
    assert importlib.import_module("hfppl.llms").__spec__.name == "llamppl.llms"
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("hfppl.no_such_module")


def test_clear_kv_cache_is_clear_cache():
    calls = []
    lm = make_lm()
    lm.clear_cache = lambda: calls.append(1)
    lm.clear_kv_cache()
    assert calls == [1]


def test_result_is_usable_as_a_list():
    res = run(smc_standard(TwoTokens(make_lm()), 3, seed=0))
    assert res + [] == list(res) and [] + res == res.particles
    assert res[0] is res.particles[0] and res[-1] is res.particles[2] and len(res) == 3
    assert res[:2] == res.particles[:2] and res.particles[1] in res
    assert res.log_ml <= 0  # the attributes stay


def test_model_mask_setter_and_impossible_mask_leave_the_context_untouched():
    # genlm/llamppl main's test_observe_impossible_mask_kills_particle, on our LM
    lm = make_lm()
    ctx = LMContext(lm, [0])
    ctx.model_mask = {0, 1, 2}
    assert ctx.model_mask == {0, 1, 2}
    impossible = ctx.mask_dist({3})
    m = Model()
    assert asyncio.run(m.observe(impossible, True)) is True
    assert m.weight == -math.inf and m.done_stepping()
    assert ctx.model_mask == {0, 1, 2}


def test_next_token_logprobs_reads_as_llampps_array():
    lm = make_lm()
    ctx = LMContext(lm, [0], temp=2.0)
    as_array = np.asarray(ctx.next_token_logprobs)
    awaited = asyncio.run(ctx.next_token_logprobs())
    np.testing.assert_allclose(as_array, awaited.numpy(), rtol=1e-6)
    ctx.model_mask = {0, 1}  # LLaMPPL's array reflects the pending mask, renormalised
    masked = np.asarray(ctx.next_token_logprobs)
    assert masked[2] == -np.inf and math.isclose(
        np.logaddexp(masked[0], masked[1]), 0.0, abs_tol=1e-6
    )
    assert ctx.s == str(ctx)


class Dies(Model):
    async def step(self):
        self.condition(False)


def test_all_dead_particle_counts_match_the_peer():
    # smc_standard keeps N particles at -inf; smc_steer drops zero weights, as the peer does
    assert len(run(smc_standard(Dies(), 3, seed=0))) == 3
    assert len(run(smc_steer(Dies(), 3, 2, seed=0))) == 0
