"""Run records: what every particle was at every step, written as JSON.

Every engine (``smc_standard``, ``smc_steer``, ``importance_sampling``) records when
given ``record=True`` (kept on ``SMCResult.record``) or ``record=path`` (also written
there); ``smc_standard``/``smc_steer`` also take LLaMPPL's names ``json_file=path`` and
``visualization_dir=dir`` (writes ``dir/record.json``). One snapshot is taken per step,
after reweighting and before resampling, plus the final population. Format
(``"version": 3``; version 2 lacked ``ending``, version 1 also ``parent``, ``died`` and
``append``)::

    {"format": "llamppl-run-record", "version": 3, "algorithm": "smc_standard",
     "n_particles": 8, "log_ml": -3.2,
     "steps": [{"step": 1, "ess": 7.1, "log_ml": -0.4, "resampled": false,
                "ancestors": null,
                "particles": [{"text": "The", "log_weight": -0.3, "finished": false,
                               "died": false, "parent": null}, ...]},
               {"step": 2, ...,
                "particles": [{"append": " Fed", "log_weight": -0.9, "finished": false,
                               "died": false, "parent": 0}, ...]},
               ...],
     "final": [{"append": "", "log_weight": -2.9, "finished": true, "died": false,
                "parent": 3, "ending": "end token"}, ...]}

A particle's text is ``string_for_serialization()``, stored as ``"append"`` (what
it adds to its parent's text) when it extends its parent's text and as ``"text"``
otherwise, so memory stays linear in steps × particles; ``frame_texts(record)``
gives the full texts. ``ending`` is how a finished particle's text ended (``Model.ending``:
``"end token"``, ``"forced end"`` or ``"cut"``), present only when the program names one.
A weight of −inf (a particle that
failed a condition; ``"died": true``) is written as ``null``, so the file is strict
JSON. A lone surrogate code point in a text (``"\\ud800"``: a token string that is not
valid Unicode, which browsers and strict JSON readers reject) is written as U+FFFD,
the replacement character. ``ancestors`` (chosen by resampling; for ``smc_steer``, the kept candidates)
index the same step's ``particles``. ``parent`` indexes the previous step's
``particles`` (the particle this one was extended from; ``null`` at step 1), and for
``final`` the last step's: together they are the genealogy. Memory is linear in
steps × particles (one string per particle per step).

Names. The *run record* is this dict (:data:`RunRecord`); where it goes is the
run's *record target* (:class:`RecordTarget`: keep it on the result, and the
files to write), resolved once from ``record=`` / ``json_file=`` /
``visualization_dir=`` by :func:`record_target`, which checks every path before
the run starts (a path that cannot be written fails then, not after the run).
A history entry is a :class:`~llamppl.inference.step_info.StepInfo`, which the
recorder observes (:meth:`RunRecorder.observe`).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from llamppl.modeling import Model

if TYPE_CHECKING:
    from .step_info import StepInfo

__all__ = [
    "RunRecord",
    "RecordTarget",
    "RunRecorder",
    "frame_texts",
    "record_target",
    "recorder_for",
    "write_json",
]

VERSION = 3
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

RunRecord = dict[str, Any]  # the JSON-ready run record (format above)


@dataclass(frozen=True)
class RecordTarget:
    """Where a run's record goes: always onto ``SMCResult.record``, and to each of ``paths``."""

    paths: tuple[Path, ...] = ()


def _weight(w: float) -> float | None:
    return None if w == -math.inf else float(w)


def _safe_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (see the format above)."""
    return _LONE_SURROGATE.sub("\ufffd", text) if isinstance(text, str) else text


def _text_entry(text: str, parent_text: str | None) -> dict[str, str]:
    if parent_text is not None and text.startswith(parent_text):
        return {"append": text[len(parent_text) :]}
    return {"text": text}


def frame_texts(record: RunRecord) -> list[list[str]]:
    """Full particle texts of every frame of ``record`` (its steps, then ``final``)."""
    frames = [s["particles"] for s in record["steps"]] + [record["final"]]
    out: list[list[str]] = []
    for particles in frames:
        out.append(
            [p["text"] if "text" in p else out[-1][p["parent"]] + p["append"] for p in particles]
        )
    return out


def write_json(record: RunRecord, path: str | os.PathLike) -> Path:
    """Write ``record`` as strict JSON to ``path`` (parent folders created); return the path."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, allow_nan=False))
    return path


class RunRecorder:
    """Collects per-step snapshots of a run and writes them to ``paths`` at the end."""

    def __init__(
        self, algorithm: str, n_particles: int, target: RecordTarget = RecordTarget()
    ) -> None:
        self.paths = list(target.paths)
        self.data: dict[str, Any] = {
            "format": "llamppl-run-record",
            "version": VERSION,
            "algorithm": algorithm,
            "n_particles": n_particles,
            "steps": [],
        }
        self._texts: list[str] | None = None  # the previous frame's full texts

    def _snapshot(
        self, particles: list[Model], log_weights: np.ndarray, parents: list[int] | None
    ) -> list[dict[str, Any]]:
        texts = [_safe_text(_text_of(p)) for p in particles]
        prev = self._texts
        parents = parents if parents is not None else [None] * len(particles)
        out = [
            {
                **_text_entry(text, None if a is None or prev is None else prev[a]),
                "log_weight": _weight(w),
                "finished": bool(p.finished),
                "died": w == -math.inf,
                "parent": None if a is None else int(a),
                **_ending_entry(p),
            }
            for p, text, w, a in zip(particles, texts, log_weights.tolist(), parents)
        ]
        self._texts = texts
        return out

    def _default_parents(self, n: int) -> list[int] | None:
        """Parents when particles are not created between steps: the previous step's
        ancestors if it resampled, else the same index (None at step 1)."""
        prev = self._previous_map()
        return prev if prev is not None and len(prev) == n else None

    def observe(self, info: StepInfo) -> None:
        """Record one engine step (an observer of the engine loop)."""
        parents = self._default_parents(len(info.particles))
        if info.origins is not None:
            prev = self._previous_map()
            parents = None if prev is None else [prev[o] for o in info.origins]
        self.step(
            info.step,
            list(info.particles),
            info.log_weights,
            info.ess,
            info.log_ml,
            info.ancestors,
            parents,
        )

    def _previous_map(self) -> list[int] | None:
        """Index in the previous step's ``particles`` of each particle that started this step."""
        steps = self.data["steps"]
        if not steps:
            return None
        last = steps[-1]
        if last["ancestors"] is not None:
            return list(last["ancestors"])
        return list(range(len(last["particles"])))

    def step(
        self,
        t: int,
        particles: list[Model],
        log_weights: np.ndarray,
        ess: float,
        log_ml: float,
        ancestors: np.ndarray | None,
        parents: list[int] | None = None,
    ) -> None:
        """One step's population after reweighting; ``ancestors`` chosen by resampling, if any.

        ``parents`` index the previous step's particles; by default they follow from
        the previous step's ``ancestors`` (engines that create particles between steps,
        like ``smc_steer``, pass them).
        """
        if parents is None:
            parents = self._default_parents(len(particles))
        self.data["steps"].append(
            {
                "step": t,
                "ess": float(ess),
                "log_ml": _weight(log_ml),
                "resampled": ancestors is not None,
                "ancestors": None if ancestors is None else [int(a) for a in ancestors],
                "particles": self._snapshot(particles, log_weights, parents),
            }
        )

    def finish(
        self,
        particles: list[Model],
        log_weights: np.ndarray,
        log_ml: float,
        parents: list[int] | None = None,
    ) -> RunRecord:
        """Add the final population, write every path, return the record."""
        if parents is None:
            parents = self._default_parents(len(particles))
        self.data["log_ml"] = _weight(log_ml)
        self.data["final"] = self._snapshot(particles, log_weights, parents)
        for path in self.paths:
            write_json(self.data, path)
        return self.data


def _ending_entry(particle: Model) -> dict[str, str]:
    """``{"ending": how}`` for a finished particle whose program names how it ended, else ``{}``."""
    how = particle.ending if particle.finished else None
    return {} if how is None else {"ending": str(how)}


def _text_of(particle: Model) -> str:
    text = particle.string_for_serialization()
    if not isinstance(text, str):
        raise TypeError(
            f"{type(particle).__name__}.string_for_serialization() must return a str (the "
            f"particle's text in the run record), got {type(text).__name__} {text!r}"
        )
    return text


def _check_writable(name: str, path: Path) -> None:
    """``ValueError`` naming ``name`` unless a JSON file can be written at ``path``."""
    if path.is_dir():
        raise ValueError(f"{name} must be a file path, got the directory {str(path)!r}")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{name}: cannot write {str(path)!r}, {str(parent)!r} is not a directory")
    try:  # what the end of the run will do: create folders and a file there
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise ValueError(
            f"{name}: cannot write {str(path)!r} ({exc.strerror or exc}); "
            "give a path in a writable directory"
        ) from None


def record_target(
    json_file: str | os.PathLike | None = None,
    visualization_dir: str | os.PathLike | None = None,
    record: bool | str | os.PathLike = False,
) -> RecordTarget | None:
    """The record target the keywords ask for, or None; every path is checked now, before the run.

    ``record=True`` keeps the record on the result, ``record=path`` also writes it there;
    ``json_file=path`` and ``visualization_dir=dir`` (LLaMPPL's names) write it to ``path``
    and ``dir/record.json``. ``TypeError`` for a value of the wrong type, ``ValueError``
    for an empty path or one that cannot be written (naming the keyword).
    """
    if not isinstance(record, (bool, str, os.PathLike)):
        raise TypeError(
            f"record must be True/False or a path (str or os.PathLike), got {type(record).__name__}"
        )
    paths = []
    for name, value, leaf in (
        ("json_file", json_file, None),
        ("visualization_dir", visualization_dir, "record.json"),
        ("record", None if isinstance(record, bool) else record, None),
    ):
        if value is None:
            continue
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(
                f"{name} must be a path (str or os.PathLike), got {type(value).__name__}"
            )
        if not os.fspath(value):
            raise ValueError(f"{name} must be a non-empty path, got {value!r}")
        path = Path(value).expanduser()
        if leaf:
            if path.exists() and not path.is_dir():
                raise ValueError(f"{name} must be a directory, got the file {str(path)!r}")
            path = path / leaf
        _check_writable(name, path)
        paths.append(path)
    if paths or record is True:
        return RecordTarget(tuple(paths))
    return None


def recorder_for(
    algorithm: str,
    n_particles: int,
    json_file: str | os.PathLike | None = None,
    visualization_dir: str | os.PathLike | None = None,
    record: bool | str | os.PathLike = False,
) -> RunRecorder | None:
    """A recorder when any keyword asks for one (see :func:`record_target`), else None."""
    target = record_target(json_file, visualization_dir, record)
    return None if target is None else RunRecorder(algorithm, n_particles, target)
