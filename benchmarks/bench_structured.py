"""Structured generation: mask cost per SMC step, and a JSON task against local masking in HF ``generate``.

1. Per SMC step at N = 16 and 64 (``smc_standard`` on ``GrammarConstraint`` with a
   JSON Schema, SmolLM2): the time spent computing and applying the masks (one
   batched llguidance fill, one unpack and one multiplication per step, timed inside
   the run around the engine's ``allowed_masks`` and ``apply_masks``), as a fraction of
   the step.
2. End-to-end wall time of the JSON task: ``generate_json`` (SMC, N particles) vs HF
   ``generate`` with ``GrammarLogitsProcessor`` (local masking) at batch N, same
   prompt, schema and token budget.

genlm-control (the other exact-SMC library) is not a dependency; run it in its own
environment (see ``benchmarks/reports/structured.md`` for the attempt on this machine).

    python benchmarks/bench_structured.py --particles 16 64 --max-tokens 40
"""

from __future__ import annotations

import argparse
import time

import torch

from llamppl import CachedCausalLM, run
from llamppl.decoding.grammar import masks as engine  # where MaskBatcher looks the two up
from llamppl.inference import smc_standard
from llamppl.models import GrammarConstraint, GrammarLogitsProcessor, generate_json

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "maxLength": 30},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
REQUEST = (
    "Extract the person (name, age, city) from this sentence as JSON: "
    "Maria Lopez, a 34-year-old nurse, moved from Seville to Madrid last spring."
)


class MaskTimer:
    """Wraps the engine's ``allowed_masks`` and ``apply_masks`` (the batched mask fill and its
    application, what ``MaskBatcher`` calls once per step) to time every call."""

    NAMES = ("allowed_masks", "apply_masks")

    def __init__(self) -> None:
        self.seconds, self.calls, self.rows = 0.0, 0, 0
        self._inner = {name: getattr(engine, name) for name in self.NAMES}
        self._depth = 0  # apply_masks calls allowed_masks: count only the outer call

    def install(self) -> None:
        for name, inner in self._inner.items():
            setattr(engine, name, self._timed(inner))

    def _timed(self, inner):
        def timed(lm, states, *args, **kwargs):
            self._depth += 1
            t = time.perf_counter()
            try:
                return inner(lm, states, *args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds += time.perf_counter() - t
                    self.calls += 1
                    self.rows += len(states)

        return timed

    def remove(self) -> None:
        for name, inner in self._inner.items():
            setattr(engine, name, inner)


def hf_generate(lm, prompt: str, n: int, max_tokens: int, seed: int) -> tuple[float, int]:
    ids = lm.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    ids = ids.repeat(n, 1)
    torch.manual_seed(seed)
    t = time.perf_counter()
    out = lm.model.generate(
        ids,
        attention_mask=ids.new_ones(ids.shape),
        logits_processor=[GrammarLogitsProcessor(lm, json_schema=SCHEMA)],
        do_sample=True,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_tokens,
        eos_token_id=lm.eos_token_id,
        pad_token_id=lm.eos_token_id,
    )
    return time.perf_counter() - t, out.shape[1] - ids.shape[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--particles", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    print(f"torch threads: {torch.get_num_threads()}")
    lm = CachedCausalLM.default()
    prompt = lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": REQUEST}], add_generation_prompt=True, tokenize=False
    )
    engine.ll_tokenizer(lm)  # build the llguidance tokenizer once (outside the timings)
    run(smc_standard(GrammarConstraint(lm, prompt, json_schema=SCHEMA, max_tokens=4), 2, seed=0))

    rows = []
    for n in args.particles:
        timer = MaskTimer()
        timer.install()
        try:
            lm.clear_cache()
            model = GrammarConstraint(lm, prompt, json_schema=SCHEMA, max_tokens=args.max_tokens)
            t = time.perf_counter()
            result = run(smc_standard(model, n, seed=args.seed))
            smc_s = time.perf_counter() - t
        finally:
            timer.remove()
        steps = len(result.history)
        mask_frac = timer.seconds / smc_s
        lm.clear_cache()
        t = time.perf_counter()
        out = generate_json(
            lm, prompt, SCHEMA, n_particles=n, seed=args.seed, max_tokens=args.max_tokens
        )
        e2e_s = time.perf_counter() - t
        hf_s, hf_tokens = hf_generate(lm, prompt, n, args.max_tokens, args.seed)
        rows.append(
            (
                n,
                steps,
                smc_s / steps,
                timer.seconds / steps,
                mask_frac,
                e2e_s,
                hf_s,
                hf_tokens,
                out.log_ml,
            )
        )

    print(
        f"\n{'N':>4} {'steps':>5} {'step ms':>8} {'mask ms':>8} {'mask %':>7}"
        f" {'SMC s':>7} {'HF gen s':>8} {'HF toks':>7} {'SMC/HF':>7} {'log P(valid)':>12}"
    )
    for n, steps, step_s, mask_s, frac, e2e_s, hf_s, hf_tok, log_ml in rows:
        print(
            f"{n:>4} {steps:>5} {1e3 * step_s:>8.1f} {1e3 * mask_s:>8.2f}"
            f" {100 * frac:>6.2f}% {e2e_s:>7.2f} {hf_s:>8.2f} {hf_tok:>7} {e2e_s / hf_s:>7.2f}"
            f" {log_ml:>12.3f}"
        )


if __name__ == "__main__":
    main()
