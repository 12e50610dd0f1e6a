"""Our own programs in the exact form of genlm/llamppl's and hfppl's examples, on the embedded model.

Written here (not copied): positional ``smc_standard(model, n, ess, "html", json_file)``,
the ``if LLM.backend == "hf": LLM.batch_size = ...`` guard, the old module paths
(``llamppl.llms``, ``llamppl.distributions``, ``llamppl.modeling``, ``llamppl.inference``)
and ``from hfppl import ...``. Only the model-loading line differs from the peers
(``CachedCausalLM.default()``, the ``smollm`` fixture); sizes are tiny.
"""

from __future__ import annotations

import asyncio
import string

import torch

from hfppl import LMContext as HLMContext
from hfppl import Model as HModel
from hfppl import smc_steer as h_smc_steer
from llamppl.distributions import LMContext
from llamppl.inference import smc_standard
from llamppl.llms import CachedCausalLM
from llamppl.modeling import Model


class FewLetters(Model):  # the peers' hard_constraints.py shape: token masks by word length
    def __init__(self, LLM, prompt, max_tokens):
        super().__init__()
        self.context = LMContext(LLM, prompt)
        self.max_tokens = max_tokens
        self.allowed = {
            j
            for j, v in enumerate(LLM.str_vocab)
            if j != LLM.tokenizer.eos_token_id
            and "\n" not in v
            and any(c.isalpha() or c in string.punctuation for c in v)
            and len(v.strip()) <= 4
        }
        self.eos_token_id = LLM.tokenizer.eos_token_id

    async def start(self):
        await self.observe(self.context.mask_dist(self.allowed), True)

    async def step(self):
        token = await self.sample(self.context.next_token())
        self.max_tokens -= 1
        if token == self.eos_token_id or self.max_tokens == 0:
            self.finish()
            return
        await self.observe(self.context.mask_dist(self.allowed), True)

    def string_for_serialization(self):
        return f"{self.context}"

    def immutable_properties(self):
        return ["allowed"]


def test_llamppl_example_form(smollm, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    LLM = smollm  # CachedCausalLM.default(): the only changed line
    assert isinstance(LLM, CachedCausalLM)
    if LLM.backend == "hf":
        LLM.batch_size = 40
    try:
        LLM.cache_kv(LLM.tokenizer.encode("The sky"))
        particles = asyncio.run(
            smc_standard(FewLetters(LLM, "The sky", 3), 3, 0.5, "html", "results/output.json")
        )
    finally:
        LLM.batch_size = None
    assert len(particles) == 3
    assert (tmp_path / "results" / "output.json").exists()
    for p in particles:  # every generated token passed the mask (words may join tokens)
        if p.weight > float("-inf"):
            assert all(t in p.allowed for t in p.context.generated if t != p.eos_token_id)


class NoE(HModel):  # hfppl's README program, written in its form
    def __init__(self, lm, prompt, forbidden_letter, max_tokens=3):
        super().__init__()
        self.context = HLMContext(lm, prompt)
        self.eos_token = lm.tokenizer.eos_token_id
        self.forbidden_tokens = set(i for (i, v) in enumerate(lm.vocab) if forbidden_letter in v)
        self.max_tokens = max_tokens

    async def step(self):
        await self.observe(self.context.mask_dist(self.forbidden_tokens), False)
        token = await self.sample(self.context.next_token())
        self.max_tokens -= 1
        if token.token_id == self.eos_token or self.max_tokens == 0:
            self.finish()

    def immutable_properties(self):
        return set(["forbidden_tokens"])


def test_hfppl_readme_form(smollm):
    particles = asyncio.run(h_smc_steer(NoE(smollm, "The weather today is", "e"), 2, 2))
    assert 1 <= len(particles) <= 2
    for particle in particles:
        assert "e" not in particle.context.s


def test_batch_size_caps_rows_per_forward(make_lm):
    lm = make_lm()
    contexts = [lm.encode(t) for t in ("The cat", "A dog", "My house", "Our sky", "Two")]
    whole = lm.batch_next_token_logprobs(contexts)
    assert lm.stats.forward_calls == 1
    lm2 = make_lm()
    lm2.batch_size = 2
    split = lm2.batch_next_token_logprobs(contexts)
    assert lm2.stats.forward_calls == 3  # at most 2 rows per forward: 2 + 2 + 1
    for a, b in zip(whole, split):
        assert torch.allclose(a, b, atol=1e-4)
