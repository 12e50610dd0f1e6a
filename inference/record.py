"""Run records: what every particle was at every step, written as JSON.

``smc_standard(..., json_file=path)`` and ``smc_steer(..., json_file=path)``
(LLaMPPL's keyword names; ``visualization_dir=dir`` writes ``dir/record.json``)
record one snapshot per step, taken after reweighting and before resampling,
and the final population. The file is plain JSON::

    {"format": "llamppl-run-record", "version": 1, "algorithm": "smc_standard",
     "n_particles": 8, "log_ml": -3.2,
     "steps": [{"step": 1, "ess": 7.1, "log_ml": -0.4, "resampled": false,
                "ancestors": null,
                "particles": [{"text": "...", "log_weight": -0.3, "finished": false}, ...]},
               ...],
     "final": [{"text": "...", "log_weight": -2.9, "finished": true}, ...]}

``text`` is ``string_for_serialization()``. A weight of −inf (a particle
that failed a condition) is written as ``null``, so the file is strict JSON.
``ancestors`` (after resampling; for ``smc_steer``, the kept candidates) index
the same step's ``particles``. The record is also on ``SMCResult.record``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from llamppl.modeling import Model

__all__ = ["RunRecorder", "recorder_for"]


def _weight(w: float) -> float | None:
    return None if w == -math.inf else float(w)


def _snapshot(particles: list[Model], log_weights: np.ndarray) -> list[dict[str, Any]]:
    return [
        {"text": p.string_for_serialization(), "log_weight": _weight(w), "finished": p.finished}
        for p, w in zip(particles, log_weights.tolist())
    ]


class RunRecorder:
    """Collects per-step snapshots of a run and writes them to ``paths`` at the end."""

    def __init__(self, algorithm: str, n_particles: int, paths: list[Path]) -> None:
        self.paths = paths
        self.data: dict[str, Any] = {
            "format": "llamppl-run-record",
            "version": 1,
            "algorithm": algorithm,
            "n_particles": n_particles,
            "steps": [],
        }

    def step(
        self,
        t: int,
        particles: list[Model],
        log_weights: np.ndarray,
        ess: float,
        log_ml: float,
        ancestors: np.ndarray | None,
    ) -> None:
        """One step's population after reweighting; ``ancestors`` chosen by resampling, if any."""
        self.data["steps"].append(
            {
                "step": t,
                "ess": float(ess),
                "log_ml": _weight(log_ml),
                "resampled": ancestors is not None,
                "ancestors": None if ancestors is None else [int(a) for a in ancestors],
                "particles": _snapshot(particles, log_weights),
            }
        )

    def finish(self, particles: list[Model], log_weights: np.ndarray, log_ml: float) -> dict:
        """Add the final population, write every path, return the record."""
        self.data["log_ml"] = _weight(log_ml)
        self.data["final"] = _snapshot(particles, log_weights)
        for path in self.paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.data, allow_nan=False))
        return self.data


def recorder_for(
    algorithm: str,
    n_particles: int,
    json_file: str | os.PathLike | None,
    visualization_dir: str | os.PathLike | None,
) -> RunRecorder | None:
    """A recorder when either keyword is given (``TypeError`` naming a bad one), else None."""
    paths = []
    for name, value, leaf in (
        ("json_file", json_file, None),
        ("visualization_dir", visualization_dir, "record.json"),
    ):
        if value is None:
            continue
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(
                f"{name} must be a path (str or os.PathLike), got {type(value).__name__}"
            )
        path = Path(value).expanduser()
        paths.append(path / leaf if leaf else path)
    return RunRecorder(algorithm, n_particles, paths) if paths else None
