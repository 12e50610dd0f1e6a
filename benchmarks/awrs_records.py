"""Records of the molecule and pattern benchmarks, and the table that summarises them.

Both sides (our ``awrs_runs.py`` and the genlm-control peer ``peers/genlm_awrs.py``) write
one :class:`RunRecord` JSON line per (method, instance, replicate, N); :func:`report` prints
the table of any mix of record files (``python benchmarks/awrs_report.py A.jsonl B.jsonl``)::

    import awrs_records as R                     # with benchmarks/ on sys.path
    print(R.report(R.read_records("benchmarks/results/llamppl_molecules.jsonl")))
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from awrs_metrics import Particle, bootstrap_ci
from awrs_tasks import TASKS

__all__ = ["RunRecord", "append_record", "read_records", "report", "summarize"]


@dataclass
class RunRecord:
    """One (method, instance, replicate) result: one JSON line, written by both sides.

    Attributes
    ----------
    method, task : str
        Method name (a table row) and ``"molecules"`` / ``"patterns"``.
    instance, replicate, n_particles : int
        Instance id, replicate index, number of particles.
    particles : list of Particle
        The final weighted particle set (empty after an error or timeout).
    score, valid : float
        Posterior-weighted score and validity (:func:`awrs_metrics.posterior_score`).
    predicate_calls : int
        Constraint checks made (prefix and complete).
    generated_tokens : int
        Tokens generated over all particles (one per particle extension, stop tokens included).
    cpu_seconds, wall_seconds : float
        Process CPU time and wall time of the timed part (model load and warm-up excluded).
    error : str or None
        Why the run gave no result (``"timeout: ..."``, an exception), else None.
    extra : dict
        Anything else a side records (seed, log_ml, ...).
    """

    method: str
    task: str
    instance: int
    replicate: int
    n_particles: int
    particles: list[Particle] = field(default_factory=list)
    score: float = 0.0
    valid: float = 0.0
    predicate_calls: int = 0
    generated_tokens: int = 0
    cpu_seconds: float | None = None
    wall_seconds: float | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if not isinstance(self.method, str) or not self.method:
            raise ValueError("method must be a non-empty string")
        for name in ("instance", "replicate", "n_particles", "predicate_calls", "generated_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        self.particles = [p if isinstance(p, Particle) else Particle(**p) for p in self.particles]

    def to_json(self) -> str:
        """One JSON line (no trailing newline)."""
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> RunRecord:
        """The record of one JSON line written by :meth:`to_json`."""
        return cls(**json.loads(line))


def append_record(path: Path | str, record: RunRecord) -> None:
    """Append one record to a JSON-lines file (created if missing)."""
    with Path(path).open("a", encoding="utf-8") as fh:
        fh.write(record.to_json() + "\n")


def read_records(*paths: Path | str) -> list[RunRecord]:
    """Every record of the given JSON-lines files, in order (blank lines skipped)."""
    records = []
    for path in paths:
        with Path(path).open(encoding="utf-8") as fh:
            records.extend(RunRecord.from_json(line) for line in fh if line.strip())
    return records


def summarize(records: Sequence[RunRecord], seed: int = 0) -> list[dict[str, Any]]:
    """One row per (task, method, n_particles): the figures :func:`report` prints.

    ``score`` is the mean posterior-weighted score with its bootstrap 95 % interval over the
    records (instances x replicates; errors and timeouts count as 0); ``valid`` the mean
    posterior-weighted validity; ``cpu_s`` the median CPU seconds per record (a timeout counts
    with the CPU it used until it was stopped); ``calls_per_token`` the median over records with
    generated tokens of predicate calls / generated tokens; ``errors`` counts the records without
    a result, ``timeouts`` those of them stopped by a time bound.
    """
    groups: dict[tuple[str, str, int], list[RunRecord]] = {}
    for r in records:
        groups.setdefault((r.task, r.method, r.n_particles), []).append(r)
    rows = []
    for (task, method, n), rs in groups.items():
        mean, low, high = bootstrap_ci([r.score for r in rs], seed=seed)
        cpu = [r.cpu_seconds for r in rs if r.cpu_seconds is not None]
        per_token = [r.predicate_calls / r.generated_tokens for r in rs if r.generated_tokens]
        rows.append(
            {
                "task": task,
                "method": method,
                "n_particles": n,
                "records": len(rs),
                "instances": len({r.instance for r in rs}),
                "score": mean,
                "score_low": low,
                "score_high": high,
                "valid": statistics.fmean(r.valid for r in rs),
                "cpu_s": statistics.median(cpu) if cpu else math.nan,
                "calls_per_token": statistics.median(per_token) if per_token else math.nan,
                "errors": sum(r.error is not None for r in rs),
                "timeouts": sum((r.error or "").startswith("timeout") for r in rs),
            }
        )
    return rows


def report(records: Sequence[RunRecord], seed: int = 0) -> str:
    """A plain-text table of :func:`summarize`, then its rows as one JSON line."""
    rows = summarize(records, seed=seed)
    head = (
        f"{'task':<10} {'method':<38} {'N':>3} {'runs':>4}  {'score [95% CI]':<22} "
        f"{'valid':>5} {'CPU s':>8} {'calls/tok':>9} {'errors':>6} {'timeouts':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        ci = f"{r['score']:.3f} [{r['score_low']:.3f}, {r['score_high']:.3f}]"
        lines.append(
            f"{r['task']:<10} {r['method']:<38} {r['n_particles']:>3} {r['records']:>4}  "
            f"{ci:<22} {r['valid']:>5.2f} {r['cpu_s']:>8.1f} {r['calls_per_token']:>9.2f} "
            f"{r['errors']:>6} {r['timeouts']:>8}"
        )
    lines.append(json.dumps({"awrs_report": rows}))
    return "\n".join(lines)
