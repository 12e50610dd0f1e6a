"""The tables of ``bench_spider.py``: per method, answers that run, execution accuracy with its
Wilson interval, CPU per question; and the split of a profiled run's time into forwards,
grammar masks, database checks and the rest."""

from __future__ import annotations

import statistics
from typing import Any

from _stats import wilson

__all__ = ["profile_split", "table", "wilson"]


def table(records: list[dict]) -> str:
    """Per method: questions, answers that run, execution accuracy (95 % interval), CPU s."""
    lines = [
        "| method | N | questions | runs | execution accuracy (95 % CI) | CPU s / question (mean, median) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    methods = list(dict.fromkeys(r["method"] for r in records))
    for m in methods:
        rs = [r for r in records if r["method"] == m and "error_trace" not in r]
        if not rs:
            continue
        n = len(rs)
        runs = sum(r["runs"] for r in rs)
        ok = sum(r["correct"] for r in rs)
        lo, hi = wilson(ok, n)
        cpu = [r["cpu_s"] for r in rs]
        lines.append(
            f"| {m} | {rs[0]['n_particles']} | {n} | {100 * runs / n:.1f} % | "
            f"{100 * ok / n:.1f} % ({100 * lo:.1f}–{100 * hi:.1f}) | "
            f"{statistics.mean(cpu):.2f}, {statistics.median(cpu):.2f} |"
        )
    return "\n".join(lines)


_WHERE = (
    ("forward", ("torch", "transformers", "/lm/hf/", "fast_linear")),
    ("grammar masks", ("llguidance", "/decoding/grammar/", "LLMatcher", "bitmask")),
    ("database checks", ("sqlite3", "/decoding/sql/")),
)


def profile_split(profiler: Any) -> dict[str, float]:
    """The profiled process's own time (tottime) by where it went: a function's file, or for
    a built-in (file ``~``) its name, names the part (forwards, grammar masks, database
    checks); the rest is the SMC engine, the proposals and Python."""
    import pstats

    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    out = {name: 0.0 for name, _ in _WHERE} | {"other": 0.0}
    for (file, _, name), (_, _, tottime, _, _) in stats.items():
        where = f"{file}:{name}"
        part = next((p for p, marks in _WHERE if any(m in where for m in marks)), "other")
        out[part] += tottime
    return out
