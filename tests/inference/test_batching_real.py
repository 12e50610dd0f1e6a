"""On the embedded SmolLM2: one SMC step of all particles is exactly one transformer forward."""

import pytest

from llamppl import LMContext, Model, run
from llamppl.inference import smc_standard, smc_steer


class Continue(Model):
    def __init__(self, lm, prompt, n_tokens):
        super().__init__()
        self.context = LMContext(lm, prompt)
        self.n_tokens = n_tokens

    async def step(self):
        await self.sample(self.context.next_token())
        if len(self.context.generated) >= self.n_tokens:
            self.finish()


class ContinuePlain(Continue):
    def step(self):
        self.sample(self.context.next_token())
        if len(self.context.generated) >= self.n_tokens:
            self.finish()


@pytest.mark.slow
@pytest.mark.parametrize("cls", [Continue, ContinuePlain])
def test_smc_standard_step_is_one_forward(smollm, cls):
    smollm.clear_cache()  # the fixture is shared: start from an empty trie
    before = smollm.stats.forward_calls
    result = run(
        smc_standard(cls(smollm, "The capital of France is", 3), 16, ess_threshold=1.0, seed=0)
    )
    assert result.stats["steps"] == 3
    # step 1 runs the shared prompt once; steps 2 and 3 run one new token per particle: one forward each
    assert smollm.stats.forward_calls - before == 3
    assert result.stats["forward_calls"] == 3


@pytest.mark.slow
def test_smc_steer_step_is_one_forward(smollm):
    smollm.clear_cache()
    before = smollm.stats.forward_calls
    result = run(smc_steer(Continue(smollm, "Once upon a time", 3), 4, 3, seed=0))
    assert smollm.stats.forward_calls - before == result.stats["steps"] == 3
