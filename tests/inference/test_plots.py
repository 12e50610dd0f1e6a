"""``SMCResult.plot()`` on the Agg backend: what each panel draws comes from the record."""

from __future__ import annotations

import sys

import matplotlib
import pytest
from programs import AllFailProgram, ConditionProgram, toy_lm

from llamppl import run
from llamppl.inference import smc_standard, smc_steer

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402


@pytest.mark.parametrize(
    "engine",
    [
        lambda m: smc_standard(m, 8, 1.0, seed=1, record=True),
        lambda m: smc_steer(m, 6, 2, seed=1, record=True),
    ],
)
def test_panels_show_the_record(tmp_path, engine):
    result = run(engine(ConditionProgram(toy_lm())))
    record = result.record
    fig = result.plot()
    try:
        ax_ess, ax_w, ax_gen = fig.axes[:3]
        ess_line = ax_ess.lines[0]
        assert list(ess_line.get_ydata()) == pytest.approx([s["ess"] for s in record["steps"]])
        marks = ax_ess.lines[2]  # resampling markers
        assert list(marks.get_xdata()) == [s["step"] for s in record["steps"] if s["resampled"]]
        (genealogy,) = [c for c in ax_gen.collections if isinstance(c, LineCollection)]
        frames = [s["particles"] for s in record["steps"]] + [record["final"]]
        n_links = sum(p["parent"] is not None for f in frames for p in f)
        assert n_links > 0 and len(genealogy.get_segments()) == n_links
        fig.savefig(tmp_path / "run.png")
        assert (tmp_path / "run.png").stat().st_size > 0
    finally:
        plt.close(fig)


def test_all_dead_run_plots_with_its_message():
    result = run(smc_standard(AllFailProgram(toy_lm()), 4, seed=0, record=True))
    fig = result.plot()
    try:
        assert "every particle died" in fig.axes[2].get_title()
    finally:
        plt.close(fig)


def test_missing_matplotlib_is_a_clear_import_error(monkeypatch):
    result = run(smc_standard(ConditionProgram(toy_lm()), 2, seed=0, record=True))
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match="needs matplotlib"):
        result.plot()


def test_plot_without_a_record_explains_record_true():
    result = run(smc_standard(ConditionProgram(toy_lm()), 2, seed=0))
    with pytest.raises(ValueError, match="record=True"):
        result.plot()
