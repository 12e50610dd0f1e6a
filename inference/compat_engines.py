"""LLaMPPL's spellings of the engines: ``smc_standard``'s positional order, resampling functions, results as lists.

Each adapter is the value of one row of :data:`llamppl.compat.table.ALIASES`, written with
the engines' public API; :mod:`llamppl.compat` sets it where the row says::

    smc_standard(model, 8, 0.5, "html", "out.json", "multinomial")  # LLaMPPL's positional order
    np.random.seed(0); get_resampling_fn("stratified")(weights)      # LLaMPPL's resampling form
    result + []                                                       # LLaMPPL's list of particles
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from llamppl.compat import second_form

__all__ = [
    "smc_standard",
    "multinomial_resample",
    "stratified_resample",
    "systematic_resample",
    "residual_resample",
    "RESAMPLING_METHODS",
    "get_resampling_fn",
    "particles_plus",
    "plus_particles",
]

#: LLaMPPL's positional parameters of ``smc_standard`` after ``ess_threshold``, in order.
LLAMPPL_POSITIONAL = ("visualization_dir", "json_file", "resampling_method")


@second_form
def smc_standard(ours: Callable[..., Any]) -> Callable[..., Any]:
    """Our ``smc_standard`` in LLaMPPL's positional order as well.

    ``smc_standard(model, n_particles, ess_threshold, visualization_dir, json_file,
    resampling_method)``: the three LLaMPPL parameters become our keywords
    ``visualization_dir=``, ``json_file=`` and ``resampling=`` (giving both ``resampling=`` and
    a different ``resampling_method=`` is a ``ValueError``); every other keyword is ours.
    """

    async def smc_standard(
        model: Any,
        n_particles: int,
        ess_threshold: float = 0.5,
        visualization_dir: Any = None,
        json_file: Any = None,
        resampling_method: str | None = None,
        **options: Any,
    ) -> Any:
        if resampling_method is not None:
            given = options.setdefault("resampling", resampling_method)
            if given != resampling_method:
                raise ValueError(
                    "give resampling= or resampling_method= (its LLaMPPL name), not both: "
                    f"{given!r} vs {resampling_method!r}"
                )
        return await ours(
            model,
            n_particles,
            ess_threshold,
            visualization_dir=visualization_dir,
            json_file=json_file,
            **options,
        )

    for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(smc_standard, attribute, getattr(ours, attribute))
    smc_standard.__signature__ = _llamppl_signature(inspect.signature(ours))
    return smc_standard


def _llamppl_signature(ours: inspect.Signature) -> inspect.Signature:
    """``ours`` with LLaMPPL's three positional parameters after ``ess_threshold``."""
    params = list(ours.parameters.values())
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    head = [p for p in params if p.kind is positional and p.name not in LLAMPPL_POSITIONAL]
    llamppl = [inspect.Parameter(name, positional, default=None) for name in LLAMPPL_POSITIONAL]
    rest = [p for p in params if p.kind is not positional and p.name not in LLAMPPL_POSITIONAL]
    return ours.replace(parameters=[*head, *llamppl, *rest])


# ---------------------------------------------------------------------- resampling
# LLaMPPL's form: ``fn(weights)`` with *normalised* probabilities, randomness from NumPy's
# global state (``np.random.seed``), returning ``len(weights)`` indices. The schemes are
# looked up when called: this module is imported while the engines' package may be loading.
def _llamppl_form(name: str) -> Callable[[np.ndarray], np.ndarray]:
    def resample(weights: np.ndarray) -> np.ndarray:
        from llamppl.inference.resampling import get_resampler

        scheme = get_resampler(name)
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1 or w.size == 0 or np.isnan(w).any() or (w < 0).any():
            raise ValueError(f"weights must be a non-empty 1-D array of probabilities, got {w}")
        rng = np.random.default_rng(np.random.randint(2**32))  # seeded by np.random.seed
        with np.errstate(divide="ignore"):
            return scheme(np.log(w), rng)

    resample.__name__ = resample.__qualname__ = f"{name}_resample"
    resample.__doc__ = (
        f"LLaMPPL's form of the scheme {name!r}: normalised ``weights``, NumPy's global RNG."
    )
    return resample


multinomial_resample = _llamppl_form("multinomial")
stratified_resample = _llamppl_form("stratified")
systematic_resample = _llamppl_form("systematic")
residual_resample = _llamppl_form("residual")
RESAMPLING_METHODS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "systematic": systematic_resample,
    "stratified": stratified_resample,
    "residual": residual_resample,
    "multinomial": multinomial_resample,
}


def get_resampling_fn(method: str) -> Callable[[np.ndarray], np.ndarray]:
    """LLaMPPL's lookup: the ``RESAMPLING_METHODS`` entry ``method``; ``ValueError`` otherwise."""
    if method not in RESAMPLING_METHODS:
        raise ValueError(
            f"Unknown resampling method {method!r}: must be one of {', '.join(RESAMPLING_METHODS)}"
        )
    return RESAMPLING_METHODS[method]


# ---------------------------------------------------------------------- results
def particles_plus(result: Any, other: Any) -> list[Any]:
    """LLaMPPL's ``result + [...]`` (its engines return a list): a list of particles."""
    return list(result.particles) + list(other)


def plus_particles(result: Any, other: Any) -> list[Any]:
    """LLaMPPL's ``[...] + result``: a list of particles."""
    return list(other) + list(result.particles)
