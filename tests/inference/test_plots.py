"""``SMCResult.plot()`` on the Agg backend: what each panel draws comes from the record."""

from __future__ import annotations

import math
import sys

import matplotlib
import pytest
from programs import AllFailProgram, ConditionProgram, toy_lm

from llamppl import FunctionLM, LMContext, Model, run
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
        dead = ax_ess.lines[3]  # dead particles, on the same particle axis as ESS
        assert dead.get_label() == "dead"
        assert list(dead.get_ydata()) == [
            sum(p["died"] for p in s["particles"]) for s in record["steps"]
        ]
        (genealogy,) = [c for c in ax_gen.collections if isinstance(c, LineCollection)]
        frames = [s["particles"] for s in record["steps"]] + [record["final"]]
        n_links = sum(p["parent"] is not None for f in frames for p in f)
        assert n_links > 0 and len(genealogy.get_segments()) == n_links
        fig.savefig(tmp_path / "run.png")
        assert (tmp_path / "run.png").stat().st_size > 0
    finally:
        plt.close(fig)


class Long(Model):
    """A uniform walk of ``n`` tokens (no EOS): ``n`` steps, for the axis labels."""

    def __init__(self, lm, n: int) -> None:
        super().__init__()
        self.context, self.n = LMContext(lm, [0]), n

    async def step(self) -> None:
        await self.sample(self.context.next_token())
        if len(self.context.generated) >= self.n:
            self.finish()


def _boxes(fig, labels):
    renderer = fig.canvas.get_renderer()
    return [
        lab.get_window_extent(renderer) for lab in labels if lab.get_visible() and lab.get_text()
    ]


@pytest.mark.parametrize("n_steps", [3, 12, 30, 57])
def test_axes_are_readable(n_steps):
    lm = FunctionLM(["a", "b", "c", "<eos>"], 3, lambda ctx: [0.0, 0.0, 0.0, -math.inf])
    result = run(smc_standard(Long(lm, n_steps), 3, 1.0, seed=0, record=True))
    fig = result.plot()
    try:
        fig.canvas.draw()
        assert len(fig.axes) == 3  # no second y axis: dead particles share the ESS axis
        ax_ess, ax_w, ax_gen = fig.axes
        labels = ax_gen.get_xticklabels()
        texts = [lab.get_text() for lab in labels]
        assert texts[0] == "1" and texts[-1] == "final" and len(texts) <= 11
        boxes = _boxes(fig, labels)
        assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:]))  # no two labels overlap
        for ax in (ax_ess, ax_gen):  # particle counts and indices: whole numbers only
            lo, hi = sorted(ax.get_ylim())
            ticks = [y for y in ax.get_yticks() if lo <= y <= hi]
            assert ticks and all(float(y).is_integer() for y in ticks)
        for ax in (ax_ess, ax_w):  # legends beside the data, not over it
            legend = ax.get_legend().get_window_extent(fig.canvas.get_renderer())
            assert legend.x0 >= ax.get_window_extent().x1
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
