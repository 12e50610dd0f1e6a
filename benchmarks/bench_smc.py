"""SMC on the embedded SmolLM2 vs Hugging Face `generate`, side by side in one process.

Task: the quickstart model (prompt "The Fed says", no word longer than five
letters, 30 tokens). Rows: `smc_standard` with N particles and `smc_steer` with
N particles × K=3 extensions, each next to `generate` producing 30 tokens at the
same batch size (N, resp. N·K). Reports wall-time ratio, forward calls, particle-steps
(calls of ``step``: N per step for smc_standard, N·K for smc_steer), tokens run against
the minimum (prompt + one token per distinct context a step reads: the K children of
one smc_steer particle read the same context, and particles that sampled the same
token share one), and Python overhead per step (wall time outside the transformer forward).

    python benchmarks/bench_smc.py --particles 8 16
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from _args import nonnegative_int, positive_int  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from quickstart import NoLongWords  # noqa: E402

from llamppl import CachedCausalLM, run  # noqa: E402
from llamppl.inference import smc_standard, smc_steer  # noqa: E402


class CountingModel(NoLongWords):
    particle_steps = 0
    contexts: set[tuple[int, ...]] = set()

    async def step(self):
        CountingModel.particle_steps += 1
        CountingModel.contexts.add(tuple(self.context.tokens))
        await super().step()


class ForwardTimer:
    """Accumulates time spent inside the transformer (decoder stack and LM head) of an HF model."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.seconds = 0.0
        self.modules = [model.get_decoder(), model.get_output_embeddings()]
        self.originals = [m.forward for m in self.modules]
        for module, original in zip(self.modules, self.originals):
            module.forward = self._timed(original)

    def _timed(self, original):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        return timed

    def restore(self) -> None:
        for module, original in zip(self.modules, self.originals):
            module.forward = original


def time_generate(lm: CachedCausalLM, prompt_ids: list[int], batch: int, n_tokens: int) -> float:
    ids = torch.tensor([prompt_ids] * batch, device=lm.device)
    kwargs = dict(
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n_tokens,
        min_new_tokens=n_tokens,
        do_sample=True,
        top_k=0,
        top_p=1.0,
        temperature=1.0,
        pad_token_id=lm.eos_token_id,
    )
    with torch.inference_mode():
        t0 = time.perf_counter()
        lm.model.generate(ids, **kwargs)
        return time.perf_counter() - t0


def time_smc(lm, algorithm, n: int, k: int, n_tokens: int, seed: int) -> dict:
    lm.clear_cache()
    lm.stats.reset()
    CountingModel.particle_steps = 0
    CountingModel.contexts = set()
    model = CountingModel(lm, "The Fed says", 5, n_tokens)
    timer = ForwardTimer(lm.model)
    t0 = time.perf_counter()
    if algorithm == "smc_standard":
        result = run(smc_standard(model, n, seed=seed, progress=False))
    else:
        result = run(smc_steer(model, n, k, seed=seed, progress=False))
    wall = time.perf_counter() - t0
    timer.restore()
    steps = result.stats["steps"]
    prompt = tuple(model.context.tokens)
    minimum = len(prompt) + len(CountingModel.contexts - {prompt})
    return dict(
        wall=wall,
        forwards=lm.stats.forward_calls,
        steps=steps,
        particle_steps=CountingModel.particle_steps,
        tokens=lm.stats.tokens_run,
        minimum=minimum,
        overhead_ms=1000 * (wall - timer.seconds) / max(steps, 1),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch threads (default: llamppl's choice)",
    )
    parser.add_argument("--particles", type=positive_int, nargs="+", default=[8, 16])
    parser.add_argument("--beam", type=positive_int, default=3)
    parser.add_argument("--tokens", type=positive_int, default=30)
    parser.add_argument("--seed", type=nonnegative_int, default=0)
    args = parser.parse_args()
    if args.threads is not None:  # else llamppl.threads picks at the first load
        torch.set_num_threads(args.threads)

    lm = CachedCausalLM.default()
    print(f"torch {torch.__version__}, threads = {torch.get_num_threads()}")
    prompt_ids = lm.encode("The Fed says")
    time_generate(lm, prompt_ids, 2, 4)  # warm-up
    run(smc_standard(CountingModel(lm, "The Fed says", 5, 4), 2, seed=0, progress=False))

    header = f"{'algorithm':<14}{'N':>4}{'batch':>6}{'ours s':>9}{'generate s':>11}{'ratio':>7}{'fwd':>6}{'steps':>6}{'p-steps':>8}{'tokens':>8}{'min':>6}{'tok/min':>8}{'py ms/step':>11}"
    print(header)
    print("-" * len(header))
    for n in args.particles:
        for algorithm, batch in (("smc_standard", n), ("smc_steer", n * args.beam)):
            r = time_smc(lm, algorithm, n, args.beam, args.tokens, args.seed)
            g = time_generate(lm, prompt_ids, batch, args.tokens)
            print(
                f"{algorithm:<14}{n:>4}{batch:>6}{r['wall']:>9.2f}{g:>11.2f}{r['wall'] / g:>7.2f}"
                f"{r['forwards']:>6}{r['steps']:>6}{r['particle_steps']:>8}{r['tokens']:>8}{r['minimum']:>6}"
                f"{r['tokens'] / r['minimum']:>8.3f}{r['overhead_ms']:>11.1f}"
            )
    print(
        "ratio = our wall time / generate's wall time at the same batch (goal for smc_standard <= 1.15);"
    )
    print("tok/min = tokens run / (prompt + one token per distinct context read) (goal <= 1.05).")


if __name__ == "__main__":
    main()
