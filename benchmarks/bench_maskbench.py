"""MaskBench's verdicts on every schema file of the shared sample, beside LLGuidance's published figures.

MaskBench (the test suite of JSONSchemaBench's authors) gives each schema valid and invalid
instances. Each file of the sample (``../shared/data/maskbench/schemas``, 1,500 files,
5,646 tests; its README) is compiled with the open budget (``JSONBudget(whitespace=
"flexible", max_string_length=None, max_array_items=None, closed_objects=False,
max_decimals=None)``: nothing the schema allows is cut) and keys in the schema's order,
and each instance is judged with the library's string verdict::

    text = json.dumps(grammar.order_keys(data), ensure_ascii=False)
    verdict = grammar.accepts_end(text)         # must equal the test's "valid"

(``ensure_ascii=False`` as MaskBench's own runner writes instances). Per file: the outcome
(compiled, refused: a ``ValueError`` from the library, timed out), the tier, the compile time
(cold: every file's schema compiled once, after a warm-up), every wrong verdict with its
cause (where the grammar refused the text, or the final check's message, or the engine's
error). Side columns judge the instances as given (MaskBench's own key order) and written
with ``\\uXXXX`` escapes (``json.dumps``' default). A rebuilt grammar (the compile cache
cleared) judges every test again, in reverse order, and must agree.

``--key-order any``: the budget's ``key_order="any"`` (then the instances as given are in the
target too). ``--masks K``: on every K-th compiled file, the mask time per token of the embedded
SmolLM2's vocabulary along the tokenizer's spelling of each valid instance (llguidance's
fill alone, and the library's ``allowed_masks``), MaskBench's "TBM" measure.

One JSON line per file goes to ``--out`` (default ``benchmarks/results/maskbench.jsonl``);
``--report FILE`` reprints the summary from a record::

    python benchmarks/bench_maskbench.py
    python benchmarks/bench_maskbench.py --masks 10
    python benchmarks/bench_maskbench.py --report benchmarks/results/maskbench.jsonl
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch
from _args import positive_float, positive_int

from llamppl.constraints import CompileTimeout, ConstraintFailure, Grammar, JSONBudget
from llamppl.decoding.grammar.compile import clear_cache
from llamppl.decoding.grammar.strings import walk_text

DATA = next(
    (
        up / "shared" / "data" / "maskbench" / "schemas"
        for up in Path(__file__).resolve().parents[1:]
        if (up / "shared" / "data" / "maskbench" / "schemas").is_dir()
    ),
    Path("../shared/data/maskbench/schemas"),
)
OUT = Path(__file__).resolve().parent / "results" / "maskbench.jsonl"
OPEN = JSONBudget(
    whitespace="flexible",
    max_string_length=None,
    max_array_items=None,
    closed_objects=False,
    max_decimals=None,
)
TIERS = ("exact", "relaxed", "stripped", "skeleton")
#: LLGuidance's own figures (MaskBench README, llguidance 0.7.10): files passing (a compile
#: error fails a file; a file without tests passes), and mask time per token on average.
LLGUIDANCE = {"files": 11_306, "passing": 8_909, "mask_us": 50}


def verdict(grammar: Grammar, text: str) -> tuple[bool | None, str]:
    """(the grammar's end verdict on ``text``, why it refused) — None when the engine failed."""
    try:
        if grammar.accepts_end(text):
            return True, ""
    except ConstraintFailure as failure:
        return None, failure.cause
    walk = walk_text(grammar.spec, text)
    if not walk.prefix:
        data = text.encode()
        around = data[max(0, walk.consumed - 30) : walk.consumed].decode(errors="replace")
        return (
            False,
            f"grammar refused byte {walk.consumed}: ...{around}|{chr(data[walk.consumed])}",
        )
    if not walk.accepting:
        return False, "grammar: not a whole sentence"
    return False, f"final check: {grammar.check.last_error}"


def judge_file(path: Path, limit: float, budget: JSONBudget = OPEN) -> dict:
    """The record of one MaskBench file (module docstring)."""
    case = json.loads(path.read_text())
    tests = case["tests"]
    row: dict = {"file": path.name, "tests": len(tests), "valid": sum(t["valid"] for t in tests)}
    started = time.perf_counter()
    try:
        grammar = Grammar.from_json_schema(case["schema"], budget=budget, compile_timeout=limit)
    except CompileTimeout as exc:
        return row | {
            "outcome": "timed out",
            "compile_s": time.perf_counter() - started,
            "error": str(exc)[:200],
        }
    except (ValueError, TypeError) as exc:
        return row | {
            "outcome": "refused",
            "compile_s": time.perf_counter() - started,
            "error": str(exc)[:200],
        }
    row |= {"outcome": "compiled", "compile_s": time.perf_counter() - started}
    row["tier"] = TIERS[min(len(grammar.relaxed), 3)]
    wrong, given, ascii_, verdicts = [], 0, 0, []
    started = time.perf_counter()
    for i, test in enumerate(tests):
        ordered = grammar.order_keys(test["data"])
        got, cause = verdict(grammar, json.dumps(ordered, ensure_ascii=False))
        verdicts.append(got)
        if got is not test["valid"]:
            kind = (
                "engine limit"
                if got is None
                else ("valid rejected" if test["valid"] else "invalid accepted")
            )
            note = test.get("python_error", "")[:120] if kind == "invalid accepted" else cause[:160]
            wrong.append({"test": i, "kind": kind, "cause": note})
        given += (
            verdict(grammar, json.dumps(test["data"], ensure_ascii=False))[0] is not test["valid"]
        )
        ascii_ += verdict(grammar, json.dumps(ordered))[0] is not test["valid"]
    row["judge_s"] = time.perf_counter() - started
    row |= {"wrong": wrong, "wrong_as_given": given, "wrong_ascii": ascii_}
    clear_cache()
    again = Grammar.from_json_schema(case["schema"], budget=budget, compile_timeout=None)
    texts = [json.dumps(again.order_keys(t["data"]), ensure_ascii=False) for t in tests]
    rebuilt = [verdict(again, text)[0] for text in texts[::-1]][::-1]
    row["rebuilt_differs"] = sum(a is not b for a, b in zip(verdicts, rebuilt))
    return row


def mask_times(paths: list[Path]) -> dict:
    """Mask time per token (µs) on SmolLM2's vocabulary along each valid instance's spelling."""
    import llguidance.torch as llt

    from llamppl import CachedCausalLM
    from llamppl.decoding.grammar.masks import allowed_masks

    lm = CachedCausalLM.default()
    fill, ours, tokens = [], [], 0
    for path in paths:
        case = json.loads(path.read_text())
        grammar = Grammar.from_json_schema(case["schema"], budget=OPEN)
        for test in case["tests"]:
            if not test["valid"]:
                continue
            state = grammar.start(lm)
            bits = llt.allocate_token_bitmask(1, lm.vocab_size)
            for token in lm.encode(
                json.dumps(grammar.order_keys(test["data"]), ensure_ascii=False)
            ):
                t0 = time.perf_counter()
                llt.fill_next_token_bitmask(state.matcher, bits, 0)
                t1 = time.perf_counter()
                allowed_masks(lm, [state])
                t2 = time.perf_counter()
                fill.append(t1 - t0)
                ours.append(t2 - t1)
                tokens += 1
                if not state.consume(token):
                    break
    return {
        "files": len(paths),
        "tokens": tokens,
        "fill_us": _micros(fill),
        "allowed_masks_us": _micros(ours),
    }


def _micros(seconds: list[float]) -> dict[str, float]:
    """Mean, median and p99 of ``seconds``, in µs."""
    a = np.array(seconds) * 1e6
    return {
        "mean": float(a.mean()),
        "median": float(np.median(a)),
        "p99": float(np.percentile(a, 99)),
    }


def report(rows: list[dict], masks: dict | None = None) -> None:
    """Print the summary of a record's rows (the report's tables)."""
    files = [r for r in rows if "file" in r]
    tests = sum(r["tests"] for r in files)
    compiled = [r for r in files if r["outcome"] == "compiled"]
    refused = [r for r in files if r["outcome"] != "compiled"]
    refused_tests = sum(r["tests"] for r in refused)
    wrong = [(r["file"], w) for r in compiled for w in r["wrong"]]
    kinds = collections.Counter(w["kind"] for _, w in wrong)
    passing = sum(1 for r in compiled if not r["wrong"])
    print(f"files {len(files)}, tests {tests} ({sum(r['valid'] for r in files)} valid)")
    print(
        f"compiled {len(compiled)}, refused {sum(r['outcome'] == 'refused' for r in refused)}, "
        f"timed out {sum(r['outcome'] == 'timed out' for r in refused)}"
    )
    print("tiers:", dict(collections.Counter(r["tier"] for r in compiled)))
    print(
        f"files passing (every test right, compiled): {passing} of {len(files)} "
        f"({100 * passing / len(files):.2f} %); LLGuidance's own: {LLGUIDANCE['passing']} of "
        f"{LLGUIDANCE['files']} ({100 * LLGUIDANCE['passing'] / LLGUIDANCE['files']:.1f} %)"
    )
    print(
        f"wrong verdicts: {len(wrong)} of {tests} tests ({100 * len(wrong) / tests:.3f} %): {dict(kinds)}"
    )
    print(
        f"tests refused (their schema refused or timed out): {refused_tests} ({100 * refused_tests / tests:.3f} %)"
    )
    for name in ("wrong_as_given", "wrong_ascii"):
        n = sum(r.get(name, 0) for r in compiled)
        print(f"  side column {name}: {n} wrong ({100 * n / tests:.3f} %)")
    print(
        f"rebuilt grammars judging differently: {sum(r.get('rebuilt_differs', 0) for r in compiled)} tests"
    )
    times = np.array([r["compile_s"] for r in files])
    print(
        f"compile s: median {np.median(times):.4f}, p99 {np.percentile(times, 99):.3f}, "
        f"max {times.max():.3f} ({files[int(times.argmax())]['file']})"
    )
    judge = np.array([r["judge_s"] / r["tests"] for r in compiled if r["tests"]])
    print(
        f"judging s per test (three serializations): median {np.median(judge):.4f}, max {judge.max():.3f}"
    )
    for file, w in wrong:
        print(f"  WRONG {file} #{w['test']}: {w['kind']}: {w['cause']}")
    for r in refused:
        print(f"  REFUSED {r['file']} ({r['tests']} tests): {r['error'][:160]}")
    if masks:
        print(
            f"masks ({masks['files']} files, {masks['tokens']} tokens of SmolLM2): llguidance fill "
            f"{masks['fill_us']}, allowed_masks {masks['allowed_masks_us']} µs; LLGuidance's "
            f"published mean ~{LLGUIDANCE['mask_us']} µs"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="folder of MaskBench files")
    parser.add_argument("--out", type=Path, default=OUT, help="record: one JSON line per file")
    parser.add_argument(
        "--limit", type=positive_float, default=10.0, help="compile seconds per schema"
    )
    parser.add_argument(
        "--masks", type=int, default=0, help="mask times on every K-th file (0: none)"
    )
    parser.add_argument("--first", type=positive_int, default=None, help="only the first N files")
    parser.add_argument(
        "--key-order", choices=("schema", "any"), default="schema", help="JSONBudget.key_order"
    )
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    parser.add_argument("--report", type=Path, default=None, help="reprint the summary of a record")
    args = parser.parse_args()
    if args.report is not None:
        rows = [json.loads(line) for line in args.report.read_text().splitlines() if line]
        report(rows, next((r["masks"] for r in rows if "masks" in r), None))
        return
    torch.set_num_threads(args.threads)
    paths = sorted(args.data.glob("*.json"))[: args.first]
    if not paths:
        raise SystemExit(f"no MaskBench files in {args.data} (see shared/data/maskbench/README.md)")
    budget = dataclasses.replace(OPEN, key_order=args.key_order)
    print(f"torch threads: {torch.get_num_threads()}; {len(paths)} files from {args.data}")
    print(f"budget: {budget}")
    started = time.perf_counter()
    Grammar.from_json_schema(
        {"type": "object", "properties": {"a": {"format": "date"}}}, budget=OPEN
    )
    print(f"warm-up (first compile, not counted): {time.perf_counter() - started:.2f} s")
    clear_cache()
    rows = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as out:
        for path in paths:
            row = judge_file(path, args.limit, budget)
            rows.append(row)
            out.write(json.dumps(row) + "\n")
        masks = None
        if args.masks:
            compiled = {r["file"] for r in rows if r["outcome"] == "compiled"}
            masks = mask_times([p for p in paths[:: args.masks] if p.name in compiled])
            out.write(json.dumps({"masks": masks}) + "\n")
    print(f"wall: {time.perf_counter() - started:.0f} s; record: {args.out}")
    report(rows, masks)


if __name__ == "__main__":
    main()
