"""``SMCResult.plot()``: a run record drawn with matplotlib (an optional dependency).

Three panels over the steps of the record (:mod:`llamppl.inference.record`):

1. in particles: ESS after reweighting (before resampling), the line N, the number
   of dead particles (weight zero), and a red marker at each step that resampled;
2. the spread of the finite log weights per step (min–max band, median line);
3. the genealogy: a line from each particle to its parent in the previous frame
   (frames are the steps, then the final population), dead particles in red.

Legends sit to the right of the panels, outside the data; particle axes have whole
ticks; long runs label at most 11 frames.

::

    fig = result.plot()          # result from a run with record=True
    fig.savefig("run.png")
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["plot_record"]


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(
            "result.plot() needs matplotlib: pip install matplotlib (or llamppl[plot])"
        ) from exc
    return plt


def _spread(particles: list[dict[str, Any]]) -> tuple[float, float, float]:
    lw = np.array([p["log_weight"] for p in particles if p["log_weight"] is not None])
    if lw.size == 0:
        return (np.nan, np.nan, np.nan)
    return (float(lw.min()), float(np.median(lw)), float(lw.max()))


def _frame_ticks(n_steps: int, most: int = 10) -> list[int]:
    """At most ``most`` + 1 evenly spaced frame indices: steps, then ``n_steps`` (the final frame).

    A step closer than half a spacing to the final frame is left out, so its label
    and "final" never overlap.
    """
    every = max(1, -(-n_steps // most))
    ticks = list(range(0, n_steps, every))
    if ticks and n_steps - ticks[-1] < max(every / 2, 1):
        ticks.pop()
    return ticks + [n_steps]


def plot_record(record: dict):
    """Draw ``record`` (ESS, log-weight spread, genealogy); return the matplotlib Figure."""
    if not isinstance(record, dict) or record.get("format") != "llamppl-run-record":
        raise ValueError("record must be a run record (a dict with format 'llamppl-run-record')")
    plt = _pyplot()
    from matplotlib.collections import LineCollection
    from matplotlib.ticker import MaxNLocator

    steps = record["steps"]
    n = record["n_particles"]
    t = np.array([s["step"] for s in steps], dtype=float)
    fig, (ax_ess, ax_w, ax_gen) = plt.subplots(3, 1, figsize=(9, 8), constrained_layout=True)
    fig.suptitle(f"{record['algorithm']}: {n} particles")
    outside = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": "small"}

    # particles on one axis: ESS, N, dead particles, and the steps that resampled
    ax_ess.plot(t, [s["ess"] for s in steps], "-o", ms=3, label="ESS")
    ax_ess.axhline(n, color="grey", lw=0.8, ls=":", label="N")
    resampled = [s["step"] for s in steps if s["resampled"]]
    ax_ess.plot(resampled, [0] * len(resampled), "rv", ls="none", label="resampled")
    dead = [sum(p["died"] for p in s["particles"]) for s in steps]
    ax_ess.step(t, dead, "-", color="C3", where="mid", lw=1.2, alpha=0.8, label="dead")
    ax_ess.set_ylabel("particles")
    top = max([n] + [len(s["particles"]) for s in steps])  # smc_steer: N·K candidates
    ax_ess.set_ylim(-0.05 * top, 1.05 * top)
    ax_ess.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_ess.legend(**outside)

    spread = np.array([_spread(s["particles"]) for s in steps]).reshape(-1, 3)
    ax_w.fill_between(t, spread[:, 0], spread[:, 2], alpha=0.3, label="min–max")
    ax_w.plot(t, spread[:, 1], label="median")
    ax_w.set_ylabel("log weight")
    ax_w.legend(**outside)
    for ax in (ax_ess, ax_w):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")

    frames = [s["particles"] for s in steps] + [record["final"]]
    segments = [
        [(f - 1, p["parent"]), (f, i)]
        for f in range(1, len(frames))
        for i, p in enumerate(frames[f])
        if p["parent"] is not None
    ]
    ax_gen.add_collection(LineCollection(segments, colors="C0", linewidths=0.6, alpha=0.6))
    for f, particles in enumerate(frames):
        died = np.array([p["died"] for p in particles], dtype=bool)
        y = np.arange(len(particles))
        ax_gen.plot(np.full((~died).sum(), f), y[~died], "o", color="C0", ms=2)
        ax_gen.plot(np.full(died.sum(), f), y[died], "o", color="r", ms=2)
    ticks = _frame_ticks(len(steps))
    ax_gen.set_xticks(ticks, [str(steps[f]["step"]) if f < len(steps) else "final" for f in ticks])
    ax_gen.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_gen.set_xlabel("step")
    ax_gen.set_ylabel("particle")
    ax_gen.autoscale_view()
    ax_gen.invert_yaxis()
    if record.get("log_ml") is None:
        ax_gen.set_title("every particle died (log Ẑ = −inf)", color="r")
    return fig
