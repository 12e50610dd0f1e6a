"""The metrics of the molecule and pattern tasks: a finished text's score, a particle set's.

Shared by our benchmarks and the genlm-control peer (:mod:`awrs_tasks` for the tasks):

- :func:`molecule_score` — RDKit validity and QED (``rdkit``, the ``chem`` extra);
- :func:`pattern_score` — 1 when the pattern matches the whole text
  (:func:`llamppl.constraints.regex_prefix`'s complete check under a 10 s bound), else 0;
- :func:`posterior_score` — the posterior-weighted score and validity of a final particle
  set (:class:`Particle`), as genlm-eval computes it;
- :func:`bootstrap_ci` — the mean and its percentile-bootstrap interval.

Example
-------
>>> import awrs_metrics as M                     # with benchmarks/ on sys.path
>>> particles = [M.Particle(" CCO", 0.75, True), M.Particle(" C1C", 0.25, True)]
>>> M.posterior_score(particles, M.molecule_score)  # needs rdkit
(0.305..., 0.75)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from llamppl.constraints import CheckTimeout, regex_prefix, time_bound

__all__ = [
    "Particle",
    "Score",
    "bootstrap_ci",
    "molecule_score",
    "pattern_score",
    "posterior_score",
]


class Score(NamedTuple):
    """The metric of one finished text: validity and score (0 when invalid)."""

    valid: bool
    value: float


@lru_cache(maxsize=4096)
def molecule_score(text: str) -> Score:
    """RDKit validity and QED of a generated molecule (surrounding whitespace stripped).

    Valid when ``Chem.MolFromSmiles`` parses it to at least one atom and ``Chem.Kekulize``
    succeeds; the score is ``QED.qed`` then, else 0.
    """
    from rdkit import Chem, RDLogger
    from rdkit.Chem import QED

    RDLogger.DisableLog("rdApp.*")
    mol = Chem.MolFromSmiles(text.strip())
    if mol is None or mol.GetNumAtoms() == 0:
        return Score(False, 0.0)
    try:
        Chem.Kekulize(mol)
        return Score(True, float(QED.qed(mol)))
    except Exception:  # noqa: BLE001 - RDKit raises its own error types
        return Score(False, 0.0)


@lru_cache(maxsize=512)
def _pattern(pattern: str):
    return regex_prefix(pattern)


def pattern_score(pattern: str, text: str, timeout: float | None = 10.0) -> Score:
    """1 when ``regex.fullmatch(pattern, text)``, else 0 (a match that times out counts as 0).

    The match is :func:`~llamppl.constraints.regex_prefix`'s complete check, bounded by
    ``timeout`` seconds (None: no bound).
    """
    if not isinstance(pattern, str) or not isinstance(text, str):
        raise TypeError("pattern and text must be str")
    try:
        with time_bound(timeout):
            ok = _pattern(pattern).accepts_end(text)
    except CheckTimeout:
        ok = False
    return Score(ok, float(ok))


@dataclass(frozen=True)
class Particle:
    """One particle of a run's final set.

    Attributes
    ----------
    text : str
        The generated text (the stop token excluded).
    weight : float
        Its normalised posterior weight (weights of a set sum to 1, or all are 0).
    finished : bool
        True when a stop token ended it; False when it was cut at the token limit.
    """

    text: str
    weight: float
    finished: bool


def posterior_score(
    particles: Sequence[Particle], score: Callable[[str], Score], finished_only: bool = True
) -> tuple[float, float]:
    """Posterior-weighted score and validity of a particle set: ``(sum w s, sum w valid)``.

    As genlm-eval does, only finished particles with positive weight count (``finished_only``),
    renormalised among themselves; a set without one scores ``(0.0, 0.0)``.
    """
    kept = [p for p in particles if p.weight > 0 and (p.finished or not finished_only)]
    total = sum(p.weight for p in kept)
    if total <= 0:
        return 0.0, 0.0
    s = v = 0.0
    for p in kept:
        result = score(p.text)
        s += p.weight / total * result.value
        v += p.weight / total * float(result.valid)
    return s, v


def bootstrap_ci(
    values: Sequence[float], level: float = 0.95, n_resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """Mean and percentile-bootstrap interval of the mean: ``(mean, low, high)``.

    Parameters
    ----------
    values : sequence of float
        One value per (instance, replicate).
    level : float
        Coverage of the interval, in (0, 1).
    n_resamples : int
        Bootstrap resamples (with replacement, of ``len(values)`` each).
    seed : int
        Seed of the ``numpy.random.Generator`` that draws them.
    """
    x = np.asarray(list(values), dtype=float)
    if x.ndim != 1 or x.size == 0:
        raise ValueError("values must be a non-empty sequence of numbers")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_resamples, x.size))].mean(axis=1)  # (n_resamples,)
    low, high = np.percentile(means, [50 * (1 - level), 50 * (1 + level)])
    return float(x.mean()), float(low), float(high)
