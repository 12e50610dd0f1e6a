"""The sampling formulation of a hard constraint, summed by brute force, and tests against it.

``HardConstraint(proposal="sample")`` defines the target (LLaMPPL paper §2.2): draw each
token from the LM, check every whole token's text with the prefix check, end at an end
token iff the complete check passes, and treat a text cut at ``max_tokens`` by the
``truncated`` rule. :func:`sampling_target` writes that definition out again, independent
of the library's constraint code, and sums it over every token path of a small
``FunctionLM``: ``{path: P(path)}`` and Z. A path is the tuple of generated token ids, end
token included (:func:`path_of`).

:func:`assert_unbiased_paths` is the statistical test of an SMC estimator against it. Over
seeded runs, with Ẑ the run's estimate and π̂ its weighted particles,

    E[Ẑ] = Z,   E[Ẑ π̂(B)] = Z π(B) for each bin B of paths,   Ẑ π̂(outside) = 0,

each within 4 of its *measured* standard errors (no floor). The bins group the target's
paths into sets of at least ``bin_mass`` posterior mass, so that each bin is met in many
runs and its standard error is estimated well; "outside" is every path the target gives
probability 0 (a token the constraint rejects, an end the complete check refuses), where
any weight at all is an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence

import numpy as np

from llamppl import FunctionLM

__all__ = ["assert_unbiased_paths", "path_of", "sampling_target", "weighted_paths"]


def sampling_target(
    lm: FunctionLM,
    prompt: Sequence[int],
    prefix_ok: Callable[[str], bool],
    complete_ok: Callable[[str], bool],
    end_ids: Collection[int],
    max_tokens: int,
    truncated: str = "check",
) -> tuple[dict[tuple[int, ...], float], float]:
    """``({path: P(path)}, Z)`` of the sampling formulation (module docstring), by recursion
    over every token of positive probability; ``prefix_ok`` is asked only about texts made
    of whole tokens, as the definition does."""
    weights: dict[tuple[int, ...], float] = {}

    def visit(path: tuple[int, ...], text: str, log_p: float) -> None:
        row = lm.logprobs(list(prompt) + list(path)).double().tolist()
        for w, lp in enumerate(row):
            if lp == -math.inf:
                continue
            here, lp_here = path + (w,), log_p + lp
            if w in end_ids:
                if complete_ok(text):
                    weights[here] = weights.get(here, 0.0) + math.exp(lp_here)
                continue
            grown = text + lm.vocab[w]
            if not prefix_ok(grown):
                continue
            if len(here) < max_tokens:
                visit(here, grown, lp_here)
            elif truncated == "keep" or (truncated == "check" and complete_ok(grown)):
                weights[here] = weights.get(here, 0.0) + math.exp(lp_here)

    visit((), "", 0.0)
    z = sum(weights.values())
    return {path: w / z for path, w in weights.items()}, z


def path_of(particle) -> tuple[int, ...]:
    """A particle's generated token ids (the end token included when it ended)."""
    return tuple(int(t) for t in particle.context.generated)


def weighted_paths(result) -> dict[tuple[int, ...], float]:
    """``{path: (1/N) Σ_i w_i 1{path_i = path}}``: the run's Ẑ π̂(path), unnormalised."""
    n = len(result.particles)
    out: dict[tuple[int, ...], float] = {}
    for p, lw in zip(result.particles, result.log_weights):
        if lw > -math.inf:
            key = path_of(p)
            out[key] = out.get(key, 0.0) + math.exp(float(lw)) / n
    return out


def mass_bins(target: dict[tuple[int, ...], float], bin_mass: float) -> list[set]:
    """The target's paths, most probable first, grouped into sets of at least ``bin_mass``."""
    bins: list[set] = []
    current: set = set()
    mass = 0.0
    for path, w in sorted(target.items(), key=lambda kv: -kv[1]):
        current.add(path)
        mass += w
        if mass >= bin_mass:
            bins.append(current)
            current, mass = set(), 0.0
    if current:
        if bins:
            bins[-1] |= current
        else:
            bins.append(current)
    return bins


def _within(name: str, values: np.ndarray, expected: float, k: float = 4.0) -> None:
    se = values.std(ddof=1) / math.sqrt(len(values))
    gap = abs(values.mean() - expected)
    assert gap <= k * se + 1e-12 * max(1.0, abs(expected)), (
        f"{name}: mean {values.mean():.6g}, expected {expected:.6g}, "
        f"{gap / se if se else math.inf:.1f} standard errors off (se {se:.3g}, {len(values)} runs)"
    )


def assert_unbiased_paths(
    runs: Sequence, target: dict[tuple[int, ...], float], z: float, bin_mass: float = 0.05
) -> None:
    """E[Ẑ] = Z, E[Ẑ π̂(B)] = Z π(B) per bin, and no weight outside the target (module
    docstring), over ``runs`` (each an ``SMCResult``)."""
    estimates = [weighted_paths(r) for r in runs]
    outside = [sum(w for p, w in e.items() if p not in target) for e in estimates]
    stray = {p for e in estimates for p in e if p not in target}
    assert max(outside) == 0.0, f"weight on paths outside the target: {sorted(stray)[:5]}"
    _within("Z-hat", np.array([math.exp(r.log_ml) for r in runs]), z)
    for i, members in enumerate(mass_bins(target, bin_mass)):
        values = np.array([sum(e.get(p, 0.0) for p in members) for e in estimates])
        mass = sum(target[p] for p in members)
        _within(f"bin {i} ({len(members)} paths, mass {mass:.3f})", values, z * mass)
