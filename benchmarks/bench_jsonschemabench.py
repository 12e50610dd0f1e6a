"""JSONSchemaBench collections: coverage, compliance and speed of ``generate_json`` vs local masking.

Data: ``--data`` (default ``../shared/data/jsonschemabench``), one schema per file in
the Github_trivial, Github_easy, Glaiveai2K and Snowplow collections of
guidance-ai/jsonschemabench (see that directory's README for source and commit).

1. **coverage** over EVERY schema: compiles exactly (llguidance alone) / compiles
   with our relaxed tier (oneOf as anyOf, lenient keywords, the exact check kept as
   a final potential).
2. **generation** on a seeded sample of ``--sample`` schemas per collection, the same
   schemas, prompt and budget through (a) ``generate_json`` (SMC, N particles, the
   object returned is a posterior draw) and (b) HF ``generate`` with
   ``GrammarLogitsProcessor`` at batch N (local masking; the object returned is the
   first row that ended with EOS). Each returned object is validated with
   ``jsonschema`` against the schema's own draft: compliant, invalid (must be 0 for
   SMC) or no output.
3. **mask share** at ``--mask-particles`` (default 64) on the first sampled schema of
   the first ``--mask-schemas`` collections (default 1): time inside
   ``apply_masks``/``allowed_masks`` over the SMC time (run first).

SMC runs ``--concurrency`` schemas at once in this process, sharing the LM's forwards
(``benchmarks/_concurrency.py``; default: all within a row bound); a run's seconds, CPU
seconds and mask seconds are then its shares of the batch's. Every result is one JSON line
in ``--out``; a rerun skips what is there (resumable),
``--report`` only prints the tables (``--extra FILE`` adds rows written by
``bench_jsonschemabench_genlm.py``, grouped by method beside ours). Prompt: the LM's chat template with
JSONSchemaBench's system line and the schema as the user message
(``generate_json(..., chat=True)``).

    python benchmarks/bench_jsonschemabench.py --sample 50 --out /tmp/jsb.jsonl
    python benchmarks/bench_jsonschemabench.py --out /tmp/jsb.jsonl --report
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from _args import nonnegative_int, positive_int
from _concurrency import add_concurrency_argument, concurrency, solve_all

COLLECTIONS = ("Github_trivial", "Github_easy", "Glaiveai2K", "Snowplow")
DATA = next(
    (
        up / "shared" / "data" / "jsonschemabench"
        for up in Path(__file__).resolve().parents[1:]
        if (up / "shared" / "data" / "jsonschemabench").is_dir()
    ),
    Path("../shared/data/jsonschemabench"),
)


def load(path: Path):
    return json.loads(path.read_text())


def schema_files(data: Path, collection: str) -> list[Path]:
    return sorted((data / collection).glob("*.json"))


def sample(files: list[Path], k: int, seed: int) -> list[Path]:
    rng = np.random.default_rng(seed)
    idx = sorted(rng.choice(len(files), size=min(k, len(files)), replace=False))
    return [files[i] for i in idx]


def validates(schema, text: str | None) -> bool | None:
    """None: no output; else whether ``text`` validates (independent jsonschema call)."""
    if text is None:
        return None
    import jsonschema
    from jsonschema.validators import validator_for

    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        return cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(json.loads(text))
    except Exception:  # noqa: BLE001 - unparsable text or unusable schema: not compliant
        return False


class MaskTimer:
    """Adds up the time spent in the mask functions of the grammar engine (batched masks,
    and the forced-token test of ``GrammarConstraint``'s chains)."""

    def __init__(self) -> None:
        from llamppl.decoding.grammar import compile as compiled
        from llamppl.decoding.grammar import engine, masks
        from llamppl.models import grammar as program

        names = ("apply_masks", "allowed_masks", "forced_token")
        self.seconds = 0.0
        # each module that calls them through its own imported name
        self.inner = [
            (module, name, getattr(module, name))
            for module in (masks, engine, compiled, program)
            for name in names
            if hasattr(module, name)
        ]

    def __enter__(self):
        for module, name, fn in self.inner:
            setattr(module, name, self._timed(fn))
        self._start = time.perf_counter(), time.process_time()
        return self

    def _timed(self, fn):
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds += time.perf_counter() - t

        return timed

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self._start[0]
        self.cpu = time.process_time() - self._start[1]
        for module, name, fn in self.inner:
            setattr(module, name, fn)

    def record(self, tokens: int, text: str | None) -> dict:
        """The fields every runner reports: wall and CPU seconds of the block, mask seconds."""
        return {
            "seconds": self.wall,
            "cpu_seconds": self.cpu,
            "tokens": tokens,
            "mask_seconds": self.seconds,
            "text": text,
        }


def coverage(data: Path, collection: str) -> dict:
    from llamppl.decoding.grammar.compile import json_grammar

    exact = relaxed = 0
    refused: dict[str, int] = {}
    files = schema_files(data, collection)
    for f in files:
        schema = load(f)
        try:
            g = json_grammar(schema)
        except (ValueError, TypeError) as exc:
            key = str(exc).split(": ", 2)[-1].splitlines()[0][:80]
            refused[key] = refused.get(key, 0) + 1
            continue
        relaxed += 1
        exact += not g.relaxed
    return {
        "kind": "coverage",
        "collection": collection,
        "schemas": len(files),
        "exact": exact,
        "relaxed": relaxed,
        "refused": refused,
    }


def _smc_fields(out, seed: int) -> dict:
    """What a ``generate_json`` run reports besides its times: tokens, the drawn text, Ẑ."""
    tokens = sum(len(p.context.generated) for p in out.result.particles)
    text = None
    if out.texts:
        p = np.array([w for _, w in out.texts])
        text = out.texts[int(np.random.default_rng(seed).choice(len(p), p=p / p.sum()))][0]
    return {
        "tokens": tokens,
        "text": text,
        "log_ml": out.log_ml,
        "failures": out.failures,
        "forced": sum(p.forced for p in out.result.particles),
        "steps": max(len(p.context.generated) for p in out.result.particles),
    }


def run_smc(lm, schema, n: int, max_tokens: int, seed: int) -> dict:
    from llamppl.models import generate_json

    with MaskTimer() as timer, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = generate_json(
            lm, "", schema, n_particles=n, seed=seed, max_tokens=max_tokens, chat=True
        )
    fields = _smc_fields(out, seed)
    return {**timer.record(fields["tokens"], fields["text"]), **fields}


async def solve_smc(lm, schema, n: int, max_tokens: int, *, seed: int) -> dict:
    """``generate_json`` on one schema as a coroutine (problems at once share the LM)."""
    from llamppl.models import generate_json_async

    try:
        out = await generate_json_async(
            lm, "", schema, n_particles=n, seed=seed, max_tokens=max_tokens, chat=True
        )
    except (ValueError, TypeError) as exc:
        return {"refused": str(exc)[:300], "text": None, "tokens": 0}
    return _smc_fields(out, seed)


def run_hf(lm, schema, n: int, max_tokens: int, seed: int) -> dict:
    from llamppl.models import GrammarLogitsProcessor
    from llamppl.models.structured import schema_prompt

    ids = lm.tokenizer(schema_prompt(lm, "", schema), return_tensors="pt", add_special_tokens=False)
    ids = ids.input_ids.repeat(n, 1)
    torch.manual_seed(seed)
    with MaskTimer() as timer:
        proc = GrammarLogitsProcessor(lm, json_schema=schema)
        gen = lm.model.generate(
            ids,
            attention_mask=ids.new_ones(ids.shape),
            logits_processor=[proc],
            do_sample=True,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            eos_token_id=lm.eos_token_id,
            pad_token_id=lm.eos_token_id,
        )
    rows = gen[:, ids.shape[1] :].tolist()
    text, tokens = None, 0
    for row in rows:
        ended = lm.eos_token_id in row
        row = row[: row.index(lm.eos_token_id)] if ended else row
        tokens += len(row) + ended
        if ended and text is None:
            text = lm.decode(row)
    return timer.record(tokens, text)


def generation(lm, args, done: set, write) -> None:
    """Mask-share run first, then the sample round-robin over collections (partial runs stay
    balanced): SMC ``--concurrency`` schemas at once, then the HF baseline one by one."""
    samples = {
        c: sample(schema_files(args.data, c), args.sample, args.seed) for c in args.collections
    }
    for c in args.collections[: args.mask_schemas] if args.mask_particles else ():
        f = samples[c][0]
        if ("mask", c, f.name, "smc", args.mask_particles) not in done:
            rec = run_smc(lm, load(f), args.mask_particles, args.max_tokens, args.seed)
            rec.update(kind="mask", collection=c, schema=f.name, method="smc")
            rec.update(n=args.mask_particles, valid=validates(load(f), rec["text"]))
            write(rec)
    todo = [
        (i, collection, samples[collection][i], method)
        for i in range(args.sample)
        for collection in args.collections
        if i < len(samples[collection])
        for method in args.methods
        if ("gen", collection, samples[collection][i].name, method, args.particles) not in done
    ]

    def finish(i: int, collection: str, f: Path, method: str, record: dict) -> None:
        record.update(kind="gen", collection=collection, schema=f.name, method=method)
        record.update(n=args.particles, max_tokens=args.max_tokens)
        record["valid"] = validates(load(f), record.get("text"))
        write(record)
        print(
            f"{collection} {i + 1} {f.name} {method}: valid={record['valid']} "
            f"{record['seconds']:.1f}s",
            flush=True,
        )

    smc = [t for t in todo if t[3] == "smc"]
    problems = [
        (solve_smc, (load(f), args.particles, args.max_tokens), args.seed) for _, _, f, _ in smc
    ]
    k = concurrency(args.concurrency, args.particles, len(problems))
    cpu = {}

    def solved(j: int, record: dict) -> None:
        if "error" in record:
            record.update(refused=record.pop("error")[-300:], text=None, tokens=0)
        record["seconds"] = record.pop("wall_seconds")
        cpu[j] = record["cpu_seconds"]
        pending[j] = record

    pending: dict[int, dict] = {}
    if problems:
        print(f"SMC: {len(problems)} schemas, {k} at once", flush=True)
        with MaskTimer() as timer, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            solve_all(lm, problems, k, solved)
        total = sum(cpu.values()) or 1.0
        for j, (i, collection, f, method) in enumerate(smc):
            record = pending[j]
            # the mask time of the batch, split as its CPU was
            record["mask_seconds"] = timer.seconds * record["cpu_seconds"] / total
            finish(i, collection, f, method, record)
    for i, collection, f, method in todo:
        if method != "hf":
            continue
        record: dict = {}
        try:
            record.update(run_hf(lm, load(f), args.particles, args.max_tokens, args.seed))
        except (ValueError, TypeError) as exc:
            record.update(refused=str(exc)[:300], text=None, seconds=0.0, tokens=0)
        finish(i, collection, f, method, record)


def _pct(values, q):
    return float(np.percentile(values, q)) if values else float("nan")


def report(records: list[dict]) -> None:
    cov = {r["collection"]: r for r in records if r["kind"] == "coverage"}
    print("| collection | schemas | exact (llguidance) | + relaxed | refused |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for c, r in cov.items():
        n = max(r["schemas"], 1)
        print(
            f"| {c} | {n} | {r['exact']} ({100 * r['exact'] / n:.1f}%) | "
            f"{r['relaxed']} ({100 * r['relaxed'] / n:.1f}%) | {n - r['relaxed']} |"
        )
    print()
    print(
        "| collection | method | N | schemas | compliant | invalid | no output | "
        "median s | p90 s | median CPU s | tokens/s | mask share | forced |"
    )
    print(
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    gens = [r for r in records if r["kind"] in ("gen", "mask")]
    groups: dict[tuple, list] = {}
    for r in gens:
        groups.setdefault((r["collection"], r["method"], r["n"], r["kind"]), []).append(r)
    for (c, m, n, kind), rs in sorted(groups.items()):
        secs = [r["seconds"] for r in rs]
        cpus = [r["cpu_seconds"] for r in rs if r.get("cpu_seconds") is not None]
        ok = sum(r.get("valid") is True for r in rs)
        bad = sum(r.get("valid") is False for r in rs)
        none = sum(r.get("valid") is None for r in rs)
        toks = sum(r["tokens"] for r in rs) / max(sum(secs), 1e-9)
        mask = sum(r.get("mask_seconds", 0.0) for r in rs) / max(sum(secs), 1e-9)
        label = m if kind == "gen" else f"{m} (mask run)"
        share = f"{100 * mask:.1f}%" if m == "smc" else "n/a"  # only our SMC is timed
        counted = [r for r in rs if "forced" in r]  # tokens taken without a forward of their own
        forced = sum(r["forced"] for r in counted) / max(sum(r["tokens"] for r in counted), 1)
        forced = f"{100 * forced:.1f}%" if counted else "n/a"
        print(
            f"| {c} | {label} | {n} | {len(rs)} | {ok} ({100 * ok / len(rs):.0f}%) | {bad} | "
            f"{none} | {_pct(secs, 50):.1f} | {_pct(secs, 90):.1f} | {_pct(cpus, 50):.1f} | "
            f"{toks:.0f} | {share} | {forced} |"
        )
    fails: dict[str, int] = {}
    for r in gens:
        if r["method"] == "smc" and r.get("valid") is None:
            for cause, k in (r.get("failures") or {"refused": 1}).items():
                cause = cause.split(":")[0]
                fails[cause] = fails.get(cause, 0) + k
    print(f"\nSMC runs without output, causes of the final particles' deaths: {fails}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--collections", nargs="+", default=list(COLLECTIONS))
    parser.add_argument("--sample", type=nonnegative_int, default=50)
    parser.add_argument("--particles", type=positive_int, default=4)
    parser.add_argument(
        "--methods", nargs="+", choices=["smc", "hf"], default=["smc", "hf"], help="what to run"
    )
    parser.add_argument("--mask-particles", type=nonnegative_int, default=64)
    parser.add_argument("--mask-schemas", type=nonnegative_int, default=1, help="collections")
    parser.add_argument("--max-tokens", type=positive_int, default=None)
    parser.add_argument("--seed", type=nonnegative_int, default=0)
    parser.add_argument("--out", type=Path, default=Path("jsonschemabench.jsonl"))
    parser.add_argument("--report", action="store_true", help="only print the tables")
    add_concurrency_argument(parser)
    parser.add_argument(
        "--extra", type=Path, nargs="*", default=[], help="more JSON lines files for the report"
    )
    args = parser.parse_args()
    if not args.report and not args.data.is_dir():
        parser.error(f"--data: no directory {args.data}")

    records = [json.loads(line) for line in args.out.open()] if args.out.exists() else []
    if not args.report:
        from llamppl import CachedCausalLM
        from llamppl.models.structured import DEFAULT_MAX_TOKENS

        torch.set_num_threads(1)
        args.max_tokens = args.max_tokens or DEFAULT_MAX_TOKENS
        done = {
            (r["kind"], r["collection"], r.get("schema"), r.get("method"), r.get("n"))
            for r in records
        }
        with args.out.open("a") as fh:

            def write(record: dict) -> None:
                fh.write(json.dumps(record) + "\n")
                fh.flush()
                records.append(record)

            for c in args.collections:
                if ("coverage", c, None, None, None) not in done:
                    write(coverage(args.data, c))
            lm = CachedCausalLM.default()
            generation(lm, args, done, write)
    for path in args.extra:  # e.g. bench_jsonschemabench_genlm.py's rows, beside ours
        records += [json.loads(line) for line in path.open()]
    report(records)


if __name__ == "__main__":
    main()
