"""``RunOptions``: the options every inference run shares, validated in one place.

Every engine front door (``smc_standard``, ``smc_steer``, ``importance_sampling``,
``csmc_standard``) takes the run options as keywords and builds one
:class:`RunOptions` with :func:`run_options`; every driver built on an engine
(``power_smc``, ``speculative_smc``, ``generate_json``, ``particle_gibbs``, …)
takes them as ``**run`` and hands them to :func:`run_options` untouched, so the
names, defaults and checks are the same everywhere::

    options = run_options(seed=0, record=True, max_steps=200)   # an engine's front door
    options = options_from("power_smc", run)                       # a driver's **run
    options.rng          # numpy Generator fixed by seed
    options.record       # RecordTarget (keep on the result, and/or paths) or None

The options: ``seed`` (int, numpy Generator or None), ``progress`` (bool or None:
a tqdm bar, on by default when stderr is a terminal), ``record`` (True keeps the
run record on ``SMCResult.record``; a path also writes it), ``max_steps`` (step
limit, default 10,000; None for none), and LLaMPPL's ``json_file`` /
``visualization_dir`` (write the record there).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from llamppl.rng import make_rng
from llamppl.validation import check_positive_int

from .record import RecordTarget, record_target

__all__ = ["DEFAULT_MAX_STEPS", "RUN_OPTIONS", "RunOptions", "run_options", "options_from"]

DEFAULT_MAX_STEPS = 10_000

#: Names a driver's ``**run`` may carry (and each engine front door's keywords).
RUN_OPTIONS = ("seed", "progress", "record", "max_steps", "json_file", "visualization_dir")


@dataclass(frozen=True)
class RunOptions:
    """The validated options of one run (build it with :func:`run_options`).

    Attributes
    ----------
    rng : numpy.random.Generator
        Every random choice of the run draws from it.
    progress : bool | None
        Progress bar: True, False, or None (on when stderr is a terminal and
        ``LLAMPPL_PROGRESS`` is not ``0``).
    record : RecordTarget | None
        Where the run record goes (kept on the result and/or written), or None.
    max_steps : int | None
        Steps after which particles still stepping end the run with
        :class:`~llamppl.inference.steps.StepLimitError`; None for no limit.
    """

    rng: np.random.Generator
    progress: bool | None = None
    record: RecordTarget | None = None
    max_steps: int | None = DEFAULT_MAX_STEPS


def run_options(
    *,
    seed: int | np.random.Generator | None = None,
    progress: bool | None = None,
    record: bool | str | os.PathLike = False,
    max_steps: int | None = DEFAULT_MAX_STEPS,
    json_file: str | os.PathLike | None = None,
    visualization_dir: str | os.PathLike | None = None,
) -> RunOptions:
    """Validate the run options (``TypeError``/``ValueError`` naming the option) into one value.

    Record paths are checked for writability now, before any work is done.
    """
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None, got {progress!r}")
    limit = None if max_steps is None else check_positive_int("max_steps", max_steps)
    target = record_target(json_file, visualization_dir, record)
    return RunOptions(rng=make_rng(seed), progress=progress, record=target, max_steps=limit)


def options_from(caller: str, run: Mapping[str, Any]) -> RunOptions:
    """A driver's ``**run`` as :class:`RunOptions`; ``TypeError`` naming ``caller`` for a key
    that is not a run option."""
    unknown = sorted(set(run) - set(RUN_OPTIONS))
    if unknown:
        raise TypeError(
            f"{caller}() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
            f"its run options are {', '.join(RUN_OPTIONS)}"
        )
    return run_options(**run)
