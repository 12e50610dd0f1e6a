"""Observers of the inference loop: they watch each step's :class:`~llamppl.inference.step_info.StepInfo`.

The loop (:func:`~llamppl.inference.steps.run_population`) hands every step's info
to its observers and knows nothing of what they do: the history kept on
``SMCResult.history`` (:class:`History`), the particles' deaths by cause
(:class:`Failures`, ``SMCResult.failures``), the progress bar (:class:`Progress`) and
the run record (:class:`~llamppl.inference.record.RunRecorder`)::

    history, bar = History(), Progress(None, "smc_standard")
    for observe in (history.observe, bar.observe):
        observe(info)
"""

from __future__ import annotations

import math
import os
import sys
import weakref

from .step_info import StepInfo

__all__ = ["Failures", "History", "Progress", "failure_kind"]


def failure_kind(cause: str) -> str:
    """The kind of a particle's failure cause, its details dropped: ``"check timed out (over
    2 s)"`` → ``"check timed out"``, ``"token limit: ..."`` → ``"token limit"``."""
    return cause.split(":", 1)[0].split(" (", 1)[0].strip() or cause


class Failures:
    """Counts the particles that die, by the kind of their cause (:func:`failure_kind` of
    ``Model.failure``), each once, whether or not resampling later drops them."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._seen: weakref.WeakSet = weakref.WeakSet()

    def observe(self, info: StepInfo) -> None:
        for p in info.particles or ():
            if p.weight == -math.inf and p not in self._seen:
                self._seen.add(p)
                kind = failure_kind(p.failure or "weight zero")
                self.counts[kind] = self.counts.get(kind, 0) + 1


class History:
    """Keeps the summary of every step's info (no particles: none stays alive through it)."""

    def __init__(self) -> None:
        self.steps: list[StepInfo] = []

    def observe(self, info: StepInfo) -> None:
        self.steps.append(info.summary())


class Progress:
    """tqdm bar over inference steps (or jobs: ``unit``, ``total``); on when stderr is a TTY
    (or ``enabled=True``), off with LLAMPPL_PROGRESS=0. The one place that reads it."""

    def __init__(
        self, enabled: bool | None, desc: str, unit: str = "step", total: int | None = None
    ) -> None:
        if enabled is None:
            enabled = sys.stderr.isatty() and os.environ.get("LLAMPPL_PROGRESS", "1") != "0"
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(desc=desc, unit=unit, total=total, leave=True)

    def update(self, **postfix: object) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(postfix, refresh=False)

    def observe(self, info) -> None:
        """Advance by one engine step (an observer of the loop): shows its ESS and live particles."""
        self.update(ess=f"{info.ess:.1f}", live=info.n_live)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
