"""The run viewer: one self-contained HTML page that replays a run record.

``render_html(record)`` fills the template ``viewer.html`` (inline CSS and JS, no
network) with the record (schema in :mod:`llamppl.inference.record`); the page shows
a step slider and play button, each step's particles with weight bars (dead ones
struck through), the genealogy (lines from each particle to its parent in the
previous step), ESS and running log Ẑ curves with resampling marks, and on hover a
particle's weight and lineage. ``SMCResult.to_html(path)`` calls ``write_html``::

    result = run(smc_standard(model, 16, seed=0, record=True))
    result.to_html("run.html")

Charts have the step numbers on the x axis and a legend for the red resampling
ticks; a newline in a particle's one-line row shows as ``⏎``. Opening
``run.html#step=5`` starts at the sixth frame (a fragment that is not a whole number
is ignored); ``#selftest`` makes the page
move its own step control and report what it showed in ``body[data-selftest]``
(used by the browser test).
"""

from __future__ import annotations

import json
import os
import re
from importlib import resources
from pathlib import Path

__all__ = ["render_html", "write_html"]

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def render_html(record: dict) -> str:
    """The viewer page for ``record`` as one HTML string."""
    if not isinstance(record, dict) or record.get("format") != "llamppl-run-record":
        raise ValueError("record must be a run record (a dict with format 'llamppl-run-record')")
    template = resources.files(__package__).joinpath("viewer.html").read_text(encoding="utf-8")
    # strict JSON inside <script type="application/json">: '<' escaped so no text closes the
    # tag; lone surrogates (not Unicode text; Chromium dies on them) shown as U+FFFD
    data = json.dumps(record, allow_nan=False, ensure_ascii=False).replace("<", "\\u003c")
    data = _LONE_SURROGATE.sub("\ufffd", data)
    return template.replace("__RECORD__", data)


def write_html(record: dict, path: str | os.PathLike) -> Path:
    """Write the viewer page for ``record`` to ``path`` (parent folders created); return it."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(record), encoding="utf-8")
    return path
