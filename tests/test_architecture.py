"""The floors of docs/architecture.md hold in the code, and the page's import picture is current.

``scripts/import_graph.py`` parses every module's imports with ``ast``; checked here: every
module has a floor, no module imports from a higher floor (the API-edge modules aside),
the checker does catch an upward import, and the generated part of
``docs/architecture.md`` equals what the script generates from the code today.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "import_graph.py"


@pytest.fixture(scope="module")
def ig():
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def graph(ig):
    return ig.graph()


def test_the_graph_covers_every_floor_and_sees_the_known_edges(ig, graph):
    assert {ig.floor_of(m) for m in graph} >= {key for key, _, _ in ig.FLOORS}
    # spot checks against imports written in the code
    assert "llamppl.lm.base" in graph["llamppl.context"]  # from llamppl.lm.base import ...
    assert "llamppl.models.generation" in graph["llamppl.models.mh_power"]  # from .generation
    assert "llamppl.decoding.proposals.token_draw" in graph["llamppl.decoding.power_law.sampler"]


def test_the_distributed_alias_is_the_engines_module_loaded_on_demand(graph):
    # a row of the compatibility table, not a module file: no ast edge into inference/, and
    # the same module at run time
    assert "llamppl.distributed" not in graph
    alias = importlib.import_module("llamppl.distributed")
    assert alias is importlib.import_module("llamppl.inference.distributed")
    assert alias.__name__ == "llamppl.inference.distributed"


def test_no_module_imports_from_a_higher_floor(ig, graph):
    assert ig.problems(graph) == []


def test_the_checker_reports_an_upward_import_and_a_module_without_floor(ig, graph):
    bad = {m: set(ts) for m, ts in graph.items()}
    bad["llamppl.lm.base"].add("llamppl.inference.smc_standard")
    bad["llamppl.context"].add("llamppl.distributed")  # the API edge is above every floor
    bad["llamppl.newthing"] = set()
    assert ig.problems(bad) == [
        "llamppl.newthing has no floor: add it to FLOORS (or API_EDGE) in scripts/import_graph.py",
        "upward import: llamppl.context (dsl) imports llamppl.distributed (the API edge)",
        "upward import: llamppl.lm.base (lm) imports llamppl.inference.smc_standard (inference)",
    ]
    ok = {m: set(ts) for m, ts in graph.items()}
    ok["llamppl.models.specs"].add("llamppl")  # the package root counts as the DSL floor
    assert ig.problems(ok) == []
    ok["llamppl.decoding.power_law.sampler"].add("llamppl")
    assert ig.problems(ok) == []
    ok["llamppl.lm.base"].add("llamppl")
    assert ig.problems(ok) == ["upward import: llamppl.lm.base (lm) imports llamppl (dsl)"]


def test_the_architecture_page_shows_the_current_graph(ig, graph):
    doc = ig.DOC.read_text(encoding="utf-8")
    assert ig.splice(doc, ig.render(graph)) == doc, (
        "docs/architecture.md is stale: run python scripts/import_graph.py --write"
    )
