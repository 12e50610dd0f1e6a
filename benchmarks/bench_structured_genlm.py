"""genlm-control on the JSON task of ``bench_structured.py`` (same model, prompt, schema, N, budget).

genlm-control is NOT a llamppl dependency: run this script with the Python of a
separate environment that has it (``python -m venv /tmp/genlm && /tmp/genlm/bin/pip
install genlm-control``) and the converted SmolLM2 copy that ``CachedCausalLM.default()``
writes to ``~/.cache/llamppl``::

    /tmp/genlm/bin/python benchmarks/bench_structured_genlm.py --particles 16 64 --max-tokens 40

It uses genlm-control's AWRS token sampler (exact, adaptive weighted rejection
sampling) with the JSON Schema potential coerced to the LM's byte tokens, on the
``hf`` backend (CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import torch

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
MODEL_DIR = Path(os.path.expanduser("~/.cache/llamppl/SmolLM2-135M-Instruct-fp32"))


async def one(llm_potential, schema_potential, n: int, max_tokens: int):
    from genlm.control import AWRS

    coerced = schema_potential.coerce(llm_potential, f=b"".join)
    sampler = AWRS(llm_potential, coerced)
    t = time.perf_counter()
    seqs = await sampler.smc(n_particles=n, ess_threshold=0.5, max_tokens=max_tokens)
    return time.perf_counter() - t, seqs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--particles", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--max-tokens", type=int, default=40)
    args = parser.parse_args()

    torch.set_num_threads(1)
    print(f"torch threads: {torch.get_num_threads()}")
    from genlm.backend.llm import AsyncTransformer
    from genlm.control import JsonSchema, PromptedLLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    llm = PromptedLLM(AsyncTransformer(model, tok))
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": REQUEST}], add_generation_prompt=True, tokenize=False
    )
    llm.prompt_ids = tok.encode(prompt, add_special_tokens=False)
    schema = JsonSchema(SCHEMA)
    asyncio.run(one(llm, schema, 2, 4))  # warm-up (tries, caches)
    for n in args.particles:
        seconds, seqs = asyncio.run(one(llm, schema, n, args.max_tokens))
        post = seqs.decoded_posterior
        top = sorted(post.items(), key=lambda kv: -kv[1])[:3]
        print(
            f"N={n}: {seconds:.2f}s  log_ml={float(seqs.log_ml):.3f}  top={json.dumps(top)[:200]}"
        )


if __name__ == "__main__":
    main()
