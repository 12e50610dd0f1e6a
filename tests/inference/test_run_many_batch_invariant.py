"""``run_many(jobs, lm, concurrency=K)`` on the embedded SmolLM2 with a batch-invariant LM:
each job's particles, weights and log Ẑ are identical beside the others and alone."""

from __future__ import annotations

import pytest
import torch

from llamppl.constraints import max_word_length
from llamppl.distributed import Job, run_job, run_many
from llamppl.models import HardConstraint

pytestmark = pytest.mark.slow

PROMPTS = ["My cat", "The weather tomorrow will be", "Our team"]


def no_long_words(lm, prompt: str) -> HardConstraint:
    return HardConstraint(lm, prompt, max_word_length(5), max_tokens=4)


@pytest.mark.parametrize("weights", ["default", "fp32"])
def test_jobs_beside_each_other_equal_their_runs_alone(smollm, weights):
    """With the weights ``CachedCausalLM.default()`` loads, and with float32 ``nn.Linear``."""
    from llamppl.lm.hf.cached_causal_lm import CachedCausalLM
    from llamppl.lm.hf.load import load_default

    model, tokenizer = (
        (smollm.model, smollm.tokenizer)
        if weights == "default"
        else load_default(None, torch.float32)
    )
    lm = CachedCausalLM(model, tokenizer, batch_invariant=True, verify=False)
    jobs = [
        Job(no_long_words, (p,), seed, "smc_standard", {"n_particles": 4})
        for seed, p in enumerate(PROMPTS)
    ]
    alone = [run_job(job, lm, i) for i, job in enumerate(jobs)]  # each on a fresh cache
    forwards = lm.stats.forward_calls
    together = run_many(jobs, lm, concurrency=3, progress=False)
    assert lm.stats.forward_calls - forwards < forwards  # the jobs shared forwards
    for a, b in zip(alone, together):
        assert a.ok and b.ok, (a.error, b.error)
        assert (a.particles, a.log_weights, a.log_ml) == (b.particles, b.log_weights, b.log_ml)
