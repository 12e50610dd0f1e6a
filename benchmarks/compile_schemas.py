"""Compile time of every schema of JSONSchemaBench collections through ``json_grammar``.

Each schema file of each folder is compiled once, one after the other, with the library's
own time bound as the per-schema limit (``compile_timeout=--limit``, default 10 s); an
outcome is *compiled*, *refused* (a ``ValueError`` / ``TypeError`` from the library: an
unsatisfiable or unresolvable schema, one llguidance cannot express), *timed out*
(``CompileTimeout``) or *error* (any other exception, printed). Per folder and over all,
the script prints the counts, the median, p99 and max compile time, and the 10 slowest
schemas with their times and outcomes. A timed-out compile's worker is abandoned by the
library and may still hold a core while the next schemas compile (reported).

Data: folders given as arguments, default every collection under ``--data`` (default
``../shared/data/jsonschemabench``: one schema per ``*.json`` file, see its README)::

    python benchmarks/compile_schemas.py
    python benchmarks/compile_schemas.py ../shared/data/jsonschemabench/Snowplow --limit 5
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np
import torch
from _args import positive_float, positive_int

from llamppl.decoding.grammar.compile import CompileTimeout, json_grammar

DATA = next(
    (
        up / "shared" / "data" / "jsonschemabench"
        for up in Path(__file__).resolve().parents[1:]
        if (up / "shared" / "data" / "jsonschemabench").is_dir()
    ),
    Path("../shared/data/jsonschemabench"),
)
WARM_UP = {"type": "object", "properties": {"pw": {"type": "string", "pattern": "^(?=.*1).+$"}}}


def compile_one(path: Path, limit: float) -> tuple[str, float, str]:
    """(outcome, seconds, first line of the message) of compiling the schema in ``path``."""
    try:
        schema = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        return "error", 0.0, f"unreadable: {exc}"
    started = time.perf_counter()
    try:
        json_grammar(schema, compile_timeout=limit)
        outcome, message = "compiled", ""
    except CompileTimeout as exc:
        outcome, message = "timed out", str(exc)
    except (ValueError, TypeError) as exc:
        outcome, message = "refused", str(exc)
    except Exception as exc:  # noqa: BLE001 - reported, the sweep goes on
        outcome, message = "error", f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - started
    return outcome, seconds, (message.splitlines() or [""])[0][:160]


def summary(name: str, rows: list[tuple[str, str, float, str]], slowest: int) -> None:
    """Print the counts, the time quantiles and the slowest schemas of ``rows``
    (``(file, outcome, seconds, message)``)."""
    times = np.array([seconds for _, _, seconds, _ in rows]) if rows else np.zeros(1)
    counts = {k: sum(1 for _, o, _, _ in rows if o == k) for k in ("compiled", "refused")}
    counts |= {k: sum(1 for _, o, _, _ in rows if o == k) for k in ("timed out", "error")}
    print(
        f"{name:<16} count {len(rows):>5}  compiled {counts['compiled']:>5}  "
        f"refused {counts['refused']:>3}  timed out {counts['timed out']:>2}  "
        f"error {counts['error']:>2}  median {np.median(times):.4f} s  "
        f"p99 {np.percentile(times, 99):.3f} s  max {times.max():.3f} s"
    )
    for file, outcome, seconds, message in sorted(rows, key=lambda r: -r[2])[:slowest]:
        note = f"  {message}" if outcome != "compiled" else ""
        print(f"    {seconds:8.3f} s  {outcome:<9}  {file}{note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, help="collection folders (*.json)")
    parser.add_argument("--data", type=Path, default=DATA, help="default: every folder here")
    parser.add_argument("--limit", type=positive_float, default=10.0, help="seconds per schema")
    parser.add_argument("--slowest", type=positive_int, default=10)
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folders = args.folders or sorted(p for p in args.data.iterdir() if p.is_dir())
    print(f"torch threads: {torch.get_num_threads()}; limit per schema: {args.limit:g} s")
    started = time.perf_counter()
    json_grammar(WARM_UP)  # llguidance's and jsonschema's one-time start-up, not timed
    print(f"warm-up (first compile, not counted): {time.perf_counter() - started:.2f} s")
    everything: list[tuple[str, str, float, str]] = []
    for folder in folders:
        rows = []
        for path in sorted(folder.glob("*.json")):
            outcome, seconds, message = compile_one(path, args.limit)
            rows.append((f"{folder.name}/{path.name}", outcome, seconds, message))
        summary(folder.name, rows, args.slowest)
        everything += rows
    if len(folders) > 1:
        summary("all", everything, args.slowest)
    workers = sum(t.name == "llamppl-schema-compile" for t in threading.enumerate())
    print(f"abandoned compile workers still running: {workers}")


if __name__ == "__main__":
    main()
