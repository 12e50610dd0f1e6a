"""MaskBench's verdicts: every valid instance accepted, every invalid one refused.

MaskBench (the test suite of JSONSchemaBench's authors) pairs real schemas with valid and
invalid instances; the shared sample (``shared/data/maskbench``, its README) is read in
place, as the COLLIE tests read theirs, and the tests skip with a reason without it. Every
30th file of the sample (50 files) and the files behind the wrong answers the library once
gave are judged with the open budget (nothing the schema allows is cut) and keys in the
schema's order: ``grammar.accepts_end(json.dumps(grammar.order_keys(data)))`` must be the
instance's label. ``benchmarks/bench_maskbench.py`` runs all 1,500 files.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llguidance")
pytest.importorskip("jsonschema")

from text_programs import _shared  # noqa: E402

from llamppl.constraints import Grammar, JSONBudget  # noqa: E402
from llamppl.decoding.grammar.compile import _json_grammar  # noqa: E402

SCHEMAS = _shared("data", "maskbench", "schemas")
OPEN = JSONBudget(
    whitespace="flexible",
    max_string_length=None,
    max_array_items=None,
    closed_objects=False,
    max_decimals=None,
)
#: Files behind wrong answers the library gave: relaxed minProperties, a Draft 7 $ref with
#: siblings, an engine limit that stuck, keywords read in the schema's order.
FIXED = [
    "Github_easy---o70012.json",
    "Github_easy---o73941.json",
    "Github_hard---o13693.json",
    "Github_hard---o62065.json",
    "Github_easy---o10013.json",
    "Github_trivial---o64859.json",
    "Github_medium---o85188.json",
]


def _files() -> list[str]:
    if not SCHEMAS.is_dir():
        return []
    names = sorted(p.name for p in SCHEMAS.glob("*.json"))
    return sorted(set(names[::30]) | (set(FIXED) & set(names)))


FILES = _files()
needs_data = pytest.mark.skipif(
    not FILES, reason=f"the MaskBench sample is not at {SCHEMAS} (see shared/data/maskbench)"
)


def _verdicts(grammar: Grammar, tests: list[dict]) -> list[bool]:
    texts = [json.dumps(grammar.order_keys(t["data"]), ensure_ascii=False) for t in tests]
    return [grammar.accepts_end(text) for text in texts]


@needs_data
@pytest.mark.parametrize("name", FILES)
def test_maskbench_verdicts(name):
    case = json.loads((SCHEMAS / name).read_text())
    try:
        grammar = Grammar.from_json_schema(case["schema"], budget=OPEN)
    except ValueError as exc:  # a refusal, counted by the benchmark; none in this selection
        pytest.fail(f"refused: {exc}")
    assert _verdicts(grammar, case["tests"]) == [t["valid"] for t in case["tests"]]


@needs_data
def test_a_rebuilt_grammar_judges_like_the_first():
    """A grammar built again (not the cached one) from a schema whose valid texts cost much
    lexer work gives the same verdicts, in either order of judging."""
    case = json.loads((SCHEMAS / "Github_hard---o62065.json").read_text())
    first = Grammar.from_json_schema(case["schema"], budget=OPEN)
    again = _json_grammar(case["schema"], OPEN, True)
    assert again is not first and again.spec == first.spec
    labels = [t["valid"] for t in case["tests"]]
    assert _verdicts(first, case["tests"]) == labels
    assert _verdicts(again, case["tests"][::-1]) == labels[::-1]
    assert _verdicts(first, case["tests"]) == labels
