"""The byte view (``ByteLM``) on the embedded SmolLM2: exactness and cost by beam size (not a test).

(a) Excess bits per byte: for each text, the beam's own log-probability of the text's bytes,
    -Σ log2 P_K(b_i | b_<i), against a large-beam reference (``--ref-beam``, default 64), per
    byte, at K = 1, 4 and 16 (``--beams``). Beside it, the token LM's bits on the text's own
    (canonical) tokenization: the byte view sums every spelling, so it can only be lower.
(b) CPU per byte of the byte view against CPU per token of the token LM scoring the same
    texts token by token (each request awaited alone, as a decoding loop does), with a
    fresh token-trie cache for every run, and the exact work counts (forwards, tokens run,
    token requests, coverings).
(c) Greedy completion of prompts that end inside a word: ``ByteLM(lm, beam=8).greedy``
    against greedy decoding from the token prompt (both from ``<|endoftext|>``); a
    completion is right when its first word finishes the word as expected.
(d) ``--patterns N``: the pattern task of ``bench_patterns.py`` (same instances, chat prompt,
    library constraint ``regex_prefix``, newline stop rule, metric) on its first N instances,
    ``smc_standard`` over ``HardConstraint`` with the mask proposal at the token level (100
    tokens at most) and at the byte level (``ByteLM(lm, beam=K, context=prompt ids)``, the
    reply's bytes from an empty prompt, 100 bytes at most): posterior-weighted accuracy and
    CPU seconds.

    .venv/bin/python benchmarks/bench_bytes.py                      # writes nothing
    .venv/bin/python benchmarks/bench_bytes.py --record benchmarks/results/bytes.jsonl
    .venv/bin/python benchmarks/bench_bytes.py --only-patterns --patterns 10 --record FILE
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import time

import torch
from _args import positive_int

from llamppl import ByteLM
from llamppl.lm.bytes import document_start
from llamppl.lm.hf.cached_causal_lm import CachedCausalLM

TEXTS = [
    "The committee will meet again next Thursday to review the budget.",
    "She poured the tea slowly, watching the steam curl above the cup.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "After the storm, the village gathered to repair the broken bridge.",
    "Prices rose sharply in March, according to the latest report.",
]

# (prompt ending inside a word, the word's missing letters)
COMPLETIONS = [
    ("The chemical symbol for gold is A", "u"),
    ("The author of Hamlet is William Shakesp", "eare"),
    ("The fastest land animal is the chee", "tah"),
    ("Ice is frozen wa", "ter"),
    ("The sun rises in the ea", "st"),
    ("Seven days make one we", "ek"),
    ("Bees make hon", "ey"),
    ("The color of the clear sky is bl", "ue"),
    ("Cats chase mi", "ce"),
    ("The Great Wall is in Chi", "na"),
]


def fresh(base: CachedCausalLM) -> CachedCausalLM:
    """A token LM over the same weights with an empty cache and zeroed counters."""
    return CachedCausalLM(base.model, base.tokenizer)


async def byte_bits(byte_lm: ByteLM, text: bytes) -> float:
    """-Σ log2 P(b_i | b_<i) over the bytes of ``text`` under ``byte_lm``."""
    bits = 0.0
    for i in range(len(text)):
        lp = float((await byte_lm.next_byte_logprobs(text[:i]))[text[i]])
        bits -= lp / math.log(2)
    return bits


async def token_bits(lm: CachedCausalLM, ids: list[int], start: tuple[int, ...]) -> float:
    """-Σ log2 p(t_i | t_<i) over the token string ``ids`` after ``start``, one request at a time."""
    bits, ctx = 0.0, list(start)
    for t in ids:
        bits -= float((await lm.next_token_logprobs(ctx))[t]) / math.log(2)
        ctx.append(t)
    return bits


def timed(coro):
    c0, t0 = time.process_time(), time.perf_counter()
    out = asyncio.run(coro)
    return out, time.process_time() - c0, time.perf_counter() - t0


def first_word(text: str) -> str:
    return re.match(r"[A-Za-z]*", text).group()


async def token_greedy(lm: CachedCausalLM, prompt: str, n: int) -> str:
    ctx = list(document_start(lm)) + lm.encode(prompt)
    out: list[int] = []
    for _ in range(n):
        best = int((await lm.next_token_logprobs(ctx + out)).argmax())
        if best in lm.eos_token_ids:
            break
        out.append(best)
    return lm.decode(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--beams", type=positive_int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--ref-beam", type=positive_int, default=64)
    parser.add_argument("--greedy-beam", type=positive_int, default=8)
    parser.add_argument("--texts", type=positive_int, default=len(TEXTS))
    parser.add_argument("--record", default=None, help="append JSON lines to this file")
    parser.add_argument("--patterns", type=int, default=0, help="pattern instances (0: none)")
    parser.add_argument("--particles", type=positive_int, default=8)
    parser.add_argument("--pattern-beam", type=positive_int, default=4)
    parser.add_argument("--only-patterns", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch threads: {torch.get_num_threads()}")
    base = CachedCausalLM.default()
    if args.only_patterns:
        records = patterns(base, args)
        write(args.record, records)
        return
    start = document_start(base)
    texts = [t.encode() for t in TEXTS[: args.texts]]
    n_bytes = sum(map(len, texts))
    records = []

    # token LM baseline: bits on the canonical tokenization, CPU per token
    lm = fresh(base)
    ids = [base.encode(t.decode()) for t in texts]
    bits, cpu, wall = timed(_all(token_bits(lm, i, start) for i in ids))
    n_tokens = sum(map(len, ids))
    token_row = {
        "what": "token_lm",
        "bytes": n_bytes,
        "tokens": n_tokens,
        "bits_per_byte": sum(bits) / n_bytes,
        "cpu_s": cpu,
        "wall_s": wall,
        "cpu_per_token_ms": 1e3 * cpu / n_tokens,
        "forward_calls": lm.stats.forward_calls,
        "tokens_run": lm.stats.tokens_run,
    }
    records.append(token_row)
    print(
        f"token LM: {n_tokens} tokens, {n_bytes} bytes, {token_row['bits_per_byte']:.4f} bits/byte "
        f"(canonical spelling), CPU {token_row['cpu_per_token_ms']:.1f} ms/token, "
        f"{lm.stats.forward_calls} forwards"
    )

    rows = {}
    for k in sorted(set(args.beams) | {args.ref_beam}):
        lm = fresh(base)
        byte_lm = ByteLM(lm, beam=k)
        bits, cpu, wall = timed(_all(byte_bits(byte_lm, t) for t in texts))
        rows[k] = {
            "what": "byte_lm",
            "beam": k,
            "bytes": n_bytes,
            "bits_per_byte": sum(bits) / n_bytes,
            "cpu_s": cpu,
            "wall_s": wall,
            "cpu_per_byte_ms": 1e3 * cpu / n_bytes,
            "forward_calls": lm.stats.forward_calls,
            "tokens_run": lm.stats.tokens_run,
            "token_requests": byte_lm.stats.token_requests,
            "extensions": byte_lm.stats.extensions,
            "mean_elements": byte_lm.stats.candidates / max(byte_lm.stats.extensions, 1),
        }
    ref = rows[args.ref_beam]["bits_per_byte"]
    print(f"\nreference: beam {args.ref_beam}, {ref:.4f} bits/byte")
    print("beam  bits/byte  excess bits/byte  CPU ms/byte  ratio to ms/token  forwards  requests")
    for k, row in rows.items():
        row["reference_beam"] = args.ref_beam
        row["excess_bits_per_byte"] = row["bits_per_byte"] - ref
        row["cpu_ratio_byte_to_token"] = row["cpu_per_byte_ms"] / token_row["cpu_per_token_ms"]
        records.append(row)
        print(
            f"{k:>4}  {row['bits_per_byte']:9.4f}  {row['excess_bits_per_byte']:16.6f}  "
            f"{row['cpu_per_byte_ms']:11.1f}  {row['cpu_ratio_byte_to_token']:17.2f}  "
            f"{row['forward_calls']:8d}  {row['token_requests']:8d}"
        )

    # greedy completion of prompts that end inside a word
    lm = fresh(base)
    byte_lm = ByteLM(lm, beam=args.greedy_beam)
    byte_right = token_right = 0
    byte_cpu = token_cpu = 0.0
    for prompt, want in COMPLETIONS:
        got, cpu, _ = timed(byte_lm.greedy(prompt, max_bytes=len(want) + 2))
        byte_cpu += cpu
        tok, cpu, _ = timed(token_greedy(lm, prompt, 3))
        token_cpu += cpu
        byte_ok, token_ok = first_word(got) == want, first_word(tok) == want
        byte_right += byte_ok
        token_right += token_ok
        print(
            f"{prompt[-20:]!r:>24} byte {got!r:<12} {'ok' if byte_ok else '--'}   token {tok!r:<16} {'ok' if token_ok else '--'}"
        )
    greedy_row = {
        "what": "greedy",
        "beam": args.greedy_beam,
        "prompts": len(COMPLETIONS),
        "byte_right": byte_right,
        "token_right": token_right,
        "byte_cpu_s": byte_cpu,
        "token_cpu_s": token_cpu,
    }
    records.append(greedy_row)
    print(
        f"greedy completion: byte view (beam {args.greedy_beam}) {byte_right}/{len(COMPLETIONS)}, "
        f"token view {token_right}/{len(COMPLETIONS)}; CPU {byte_cpu:.1f} s vs {token_cpu:.1f} s"
    )
    if args.patterns:
        records += patterns(base, args)
    write(args.record, records)


def write(path: str | None, records: list[dict]) -> None:
    if path:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        with open(path, "a") as f:
            for r in records:
                f.write(json.dumps({"time": stamp, "threads": 1, **r}) + "\n")
        print(f"appended {len(records)} records to {path}")


def weighted_particles(result) -> list:
    """The run's particles as the metric reads them (finished: ended by a stop token)."""
    import awrs_metrics as M

    weights = result.weights
    total = sum(weights)
    out = []
    for p, w in zip(result.particles, weights):
        finished = p.finished and p.failure is None and len(p.context.generated) > 0
        finished = finished and int(p.context.tokens[-1]) in p.end_ids
        out.append(M.Particle(p.text, float(w / total) if total > 0 else 0.0, finished))
    return out


def patterns(base: CachedCausalLM, args) -> list[dict]:
    """Section (d): the pattern task at the token and at the byte level."""
    import awrs_metrics as M
    import awrs_tasks as T

    from llamppl.constraints import regex_prefix
    from llamppl.inference import smc_standard
    from llamppl.models import HardConstraint

    common = dict(stop="newline", check_timeout=T.CHECK_TIMEOUT)
    totals = {"token": [0.0, 0.0, 0.0], "byte": [0.0, 0.0, 0.0]}  # score, valid, CPU
    records = []
    for inst in T.instances("patterns", args.patterns):
        ids = base.encode(inst.prompt(base.tokenizer))
        row = {"what": "patterns", "instance": inst.id, "particles": args.particles}
        for view in ("token", "byte"):
            lm = fresh(base)
            if view == "token":
                model = HardConstraint(
                    lm, ids, regex_prefix(inst.pattern), "mask", max_tokens=100, **common
                )
            else:
                byte_lm = ByteLM(lm, beam=args.pattern_beam, context=ids)
                model = HardConstraint(
                    byte_lm, "", regex_prefix(inst.pattern), "mask", max_tokens=100, **common
                )
            result, cpu, _ = timed(smc_standard(model, args.particles, 0.5, seed=0))
            score, valid = M.posterior_score(weighted_particles(result), inst.score)
            best = max(zip(result.weights, result.particles), key=lambda x: x[0])[1].text
            row[view] = {
                "score": score,
                "valid": valid,
                "cpu_s": cpu,
                "forward_calls": lm.stats.forward_calls,
                "best_text": best,
            }
            for i, v in enumerate((score, valid, cpu)):
                totals[view][i] += v
        row["pattern_beam"] = args.pattern_beam
        records.append(row)
        print(
            f"pattern {inst.id:>4} {inst.pattern[:28]!r:<32} token {row['token']['score']:.2f} "
            f"({row['token']['cpu_s']:.1f} s, {row['token']['best_text']!r:.20})   byte "
            f"{row['byte']['score']:.2f} ({row['byte']['cpu_s']:.1f} s, "
            f"{row['byte']['best_text']!r:.20})"
        )
    n = args.patterns
    print(
        f"patterns ({n} instances, N = {args.particles}, mask proposal): token view accuracy "
        f"{totals['token'][0] / n:.3f}, CPU {totals['token'][2]:.1f} s; byte view (beam "
        f"{args.pattern_beam}) accuracy {totals['byte'][0] / n:.3f}, CPU {totals['byte'][2]:.1f} s"
    )
    return records


async def _all(coros):
    out = []
    for c in coros:  # one text after another: the cost of one stream
        out.append(await c)
    return out


if __name__ == "__main__":
    main()
