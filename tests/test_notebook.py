"""``examples/tour.ipynb`` runs top to bottom (``nbclient``, embedded model, about 30 s).

Every cell must run without error; the tour must show the result table, write the
viewer page, draw the plot, print the exact and estimated log Z, run a top-level ``await``,
print a JSON object from a Pydantic class, show the failures of a costly check with a
separate complete check, and print an 8-word text ending in "ocean".
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from warning_policy import pythonwarnings

nbformat = pytest.importorskip("nbformat", reason="needs nbformat (dev extra)")
nbclient = pytest.importorskip("nbclient", reason="needs nbclient and ipykernel (dev extra)")

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "tour.ipynb"


@pytest.mark.slow
def test_tour_notebook_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("LLAMPPL_PROGRESS", "0")
    monkeypatch.setenv("PYTHONWARNINGS", pythonwarnings())  # the kernel fails on a deprecated call
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError naming the failing cell

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    texts = "\n".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    assert "SMCResult(smc_steer: 4 particles" in texts
    pages = re.findall(r"viewer page: (\S+)", texts)
    assert len(pages) == 1 and Path(pages[0]).name == "tour_run.html"
    assert Path(pages[0]).stat().st_size > 0
    assert not (tmp_path / "tour_run.html").exists()  # nothing written next to the notebook
    assert list(tmp_path.iterdir()) == []
    stderr = "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")
    assert "Warning" not in stderr, stderr  # e.g. tqdm's "IProgress not found"
    assert "torch.set_num_threads" not in "".join(c.source for c in nb.cells)  # library default
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the plot
    # SMC's correctness is proved in tests/inference; here the cell must print both numbers
    assert re.search(r"exact log Z -?\d+\.\d+, SMC estimate -?\d+\.\d+", texts)
    assert "SMCResult(smc_standard: 8 particles" in texts  # the top-level await
    # JSON: Person instances printed as JSON objects
    assert re.search(r'\{"name":"[^"]*","age":-?\d+\}', texts)
    # the costly check: lazy proposal, and the failures on the result's display
    assert "proposal: lazy" in texts
    assert re.search(r"failures: \{'[a-z ]+': \d+", texts)
    assert "particles that died, by cause:" in texts
    # words and sentences: 8 words, the last one "ocean"
    line = re.search(r"^text: (.+)$", texts, re.M)
    assert line, texts
    words = line.group(1).split()
    assert len(words) == 8 and words[-1].strip(".,;:!?'\"").lower() == "ocean", words
