"""``SMCResult``: what every inference algorithm returns.

Holds the final particles and their log weights, the log marginal-likelihood
estimate, a per-step history and run statistics; displays as a table in
Jupyter and iterates over its particles (LLaMPPL compatibility)::

    result = run(smc_standard(model, 16, seed=0))
    result.log_ml            # log Ẑ
    result.posterior         # {particle text: normalised weight}
    best = result.sample()   # one particle drawn ∝ weight
"""

from __future__ import annotations

import html
import math
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llamppl.modeling import Model
from llamppl.rng import make_rng
from llamppl.weights import ess, normalize

from .record import RunRecord, write_json
from .step_info import StepInfo

__all__ = ["SMCResult"]


@dataclass
class SMCResult(Sequence):
    """Particles, log weights and log Ẑ of an inference run (exact values for ``enumerate_exact``).

    It is also the read-only sequence of its particles: ``len(result)``, ``result[0]``,
    ``result[:2]`` (a list), iteration, ``in``. ``list(result)`` gives a plain list.
    """

    particles: list[Model]
    log_weights: np.ndarray
    log_ml: float
    history: list[StepInfo] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    algorithm: str = ""
    record: RunRecord | None = None  # when record= / json_file= / visualization_dir= asked for one
    #: Particles that died during the run, by the kind of their cause (``Model.failure``:
    #: ``"condition"``, ``"token limit"``, ``"no allowed token"``, ``"check timed out"``, ...),
    #: each counted once, also those resampling dropped later; most frequent first.
    failures: dict[str, int] = field(default_factory=dict)

    def _require_record(self, what: str) -> RunRecord:
        if self.record is None:
            raise ValueError(
                f"{what} needs a run record: run the engine with record=True, e.g. "
                "run(smc_standard(model, 16, record=True)) (this result has none)"
            )
        return self.record

    def to_json(self, path: str | os.PathLike) -> Path:
        """Write the run record as strict JSON (schema: :mod:`llamppl.inference.record`)."""
        return write_json(self._require_record("to_json"), path)

    def to_html(self, path: str | os.PathLike) -> Path:
        """Write the run record as one self-contained interactive HTML page (no network)."""
        record = self._require_record("to_html")
        from .viewer import write_html

        return write_html(record, path)

    def plot(self):
        """ESS per step (resampling marked), log-weight spread and genealogy; a matplotlib Figure."""
        record = self._require_record("plot")
        from .plots import plot_record

        return plot_record(record)

    @property
    def weights(self) -> np.ndarray:
        """Normalised weights of ``particles``."""
        return normalize(self.log_weights)

    @property
    def ess(self) -> float:
        """Effective sample size of the final weights."""
        return ess(self.log_weights)

    def _mark(self, key: str) -> str:
        """`` (cut)`` or `` (forced end)`` when every weighted particle with this posterior key
        ended so (a program's ``ending``, e.g. ``HardConstraint``'s), else ``""``."""
        endings = {
            getattr(p, "ending", None)
            for p, w in zip(self.particles, self.weights)
            if w > 0 and p.string_for_serialization() == key
        }
        return f" ({endings.pop()})" if endings in ({"cut"}, {"forced end"}) else ""

    def _notes(self) -> list[str]:
        """Remarks on what the weighted particles' texts are (shown under the posterior)."""
        weighted = [p for p, w in zip(self.particles, self.weights) if w > 0]
        endings = {getattr(p, "ending", None) for p in weighted}
        notes = []
        if "cut" in endings:
            notes.append("(cut): the text reached the token limit instead of ending")
        if "forced end" in endings:
            notes.append(
                "(forced end): the text reached the token limit, where only an end token was "
                "allowed (truncated='drop'); its weight counts the LM's probability of ending there"
            )
        if any(getattr(p, "prefix_only", False) for p in weighted):
            notes.append(
                "these texts were accepted by the prefix check alone (give complete= for a "
                "separate check of finished texts)"
            )
        return notes

    @property
    def posterior(self) -> dict[str, float]:
        """Normalised weight of each distinct ``string_for_serialization()``, largest first."""
        acc: dict[str, float] = defaultdict(float)
        for p, w in zip(self.particles, self.weights):
            if w > 0:
                acc[p.string_for_serialization()] += float(w)
        return dict(sorted(acc.items(), key=lambda kv: -kv[1]))

    def sample(self, rng: np.random.Generator | int | None = None) -> Model:
        """One particle drawn with probability ∝ its weight."""
        w = self.weights
        if w.sum() <= 0:
            raise ValueError("cannot sample: every particle has weight zero (log_ml is -inf)")
        return self.particles[int(make_rng(rng).choice(len(w), p=w / w.sum()))]

    def __iter__(self):
        return iter(self.particles)

    def __len__(self) -> int:
        return len(self.particles)

    def __getitem__(self, i: int | slice) -> Model | list[Model]:
        return self.particles[i]

    def __repr__(self) -> str:
        lines = [
            f"SMCResult({self.algorithm or 'inference'}: {len(self.particles)} particles, log_ml={self.log_ml:.4f})"
        ]
        if self.log_ml == -math.inf:
            lines.append(
                "  every particle has weight zero: no path satisfied the model's constraints"
            )
        if self.failures:
            lines.append(f"  particles that died, by cause: {self._failure_text()}")
        for text, w in list(self.posterior.items())[:10]:
            lines.append(f"  {w:8.4f}  {text!r}{self._mark(text)}")
        lines += [f"  note: {note}" for note in self._notes()]
        return "\n".join(lines)

    def _failure_text(self) -> str:
        return ", ".join(f"{cause} {count}" for cause, count in self.failures.items())

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{w:.4f}</td><td style='text-align:left;white-space:pre-wrap'>{html.escape(t)}"
            f"{' <i>' + self._mark(t)[1:] + '</i>' if self._mark(t) else ''}</td></tr>"
            for t, w in list(self.posterior.items())[:20]
        )
        notes = "".join(f"<br><small>{html.escape(n)}</small>" for n in self._notes())
        viewer = ""
        if self.record is not None:  # the run viewer, folded, in a sandboxed frame
            from .viewer import render_html

            page = html.escape(render_html(self.record), quote=True)
            viewer = (
                "<details><summary>run viewer (steps, weights, genealogy)</summary>"
                f'<iframe srcdoc="{page}" sandbox="allow-scripts" '
                'style="width:100%;height:480px;border:1px solid #ddd"></iframe></details>'
            )
        return (
            f"<b>{html.escape(self.algorithm or 'inference')}</b>: {len(self.particles)} particles, "
            f"log Ẑ = {self.log_ml:.4f}, ESS = {self.ess:.2f}"
            + (
                f"<br>particles that died, by cause: {html.escape(self._failure_text())}"
                if self.failures
                else ""
            )
            + f"<table><tr><th>weight</th><th style='text-align:left'>particle</th></tr>{rows}</table>"
            f"{notes}{viewer}"
        )
