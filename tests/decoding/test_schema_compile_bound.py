"""Compiling a JSON Schema is linear in the schema and bounded in time.

Definitions that refer to each other (depth 10 and more, branching 3 and more, cycles
included) with patterns the engine refuses, so the stripped tier collects the dropped
patterns: the walk's work is counted and must stay within a constant times the schema's
nodes. A compile made slow on purpose must end in :class:`CompileTimeout` at its bound,
with the schema's size in the message, never cached, its abandoned worker running no
further tier.
"""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("llguidance", reason="needs llguidance (dev extra)")
pytest.importorskip("jsonschema")

from llamppl.decoding.grammar import compile as grammar_compile  # noqa: E402
from llamppl.decoding.grammar import json_relax  # noqa: E402
from llamppl.decoding.grammar.compile import CompileTimeout, Grammar, json_grammar  # noqa: E402
from llamppl.decoding.grammar.json_relax import strip_unsupported  # noqa: E402

LOOK = "^(?=.*1)[a-z1]{2,}$"  # a lookahead: llguidance refuses it, the stripped tier drops it


def _chain(depth: int, branch: int, cycle: bool = False) -> dict:
    """``d_i`` has ``branch`` properties that each ``$ref`` ``d_{i+1}`` (``d_0`` after the
    last when ``cycle``), and a string with :data:`LOOK`."""
    defs = {}
    for i in range(depth):
        follow = f"#/$defs/d{(i + 1) % depth if cycle else i + 1}"
        props = {f"p{j}": {"$ref": follow} for j in range(branch)}
        defs[f"d{i}"] = {
            "type": "object",
            "properties": {**props, "s": {"type": "string", "pattern": LOOK}},
        }
    if not cycle:
        defs[f"d{depth}"] = {"type": "string", "pattern": LOOK}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def _nodes(value) -> int:
    if isinstance(value, dict):
        return 1 + sum(_nodes(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_nodes(v) for v in value)
    return 0


@pytest.fixture
def visits(monkeypatch) -> list[int]:
    """Counts the nodes the dropped-pattern walk visits."""
    count = [0]
    visit = json_relax._DroppedPatterns.visit

    def counted(self, node, hops):
        count[0] += 1
        return visit(self, node, hops)

    monkeypatch.setattr(json_relax._DroppedPatterns, "visit", counted)
    return count


def _no_lookaround(pattern: str) -> bool:
    return "(?" not in pattern


@pytest.mark.parametrize(
    "depth, branch, cycle",
    [(12, 3, False), (40, 4, False), (10, 3, True), (1, 5, True), (2, 3, True), (60, 3, True)],
)
def test_dropped_pattern_walk_is_linear_in_the_schema(visits, depth, branch, cycle):
    schema = _chain(depth, branch, cycle)
    _, dropped = strip_unsupported(schema, _no_lookaround)
    nodes = _nodes(schema)
    # each definition once (acyclic); once per hop budget at most (recursive)
    bound = nodes + 1 if not cycle else (json_relax._MAX_DEPTH + 1) * nodes
    assert visits[0] <= bound, (visits[0], nodes)
    assert 0 < len(dropped) <= json_relax._MAX_RULES
    # document order: the first property down to the last reference a path may follow
    assert dropped[0] == (("p0",) * (json_relax._MAX_DEPTH - 1) + ("s",), LOOK)


def test_deep_shared_definitions_compile_through_the_stripped_tier(visits):
    schema = _chain(14, 3)  # 3**14 paths to the last definition: the walk that hung
    started = time.perf_counter()
    grammar = json_grammar(schema, compile_timeout=10.0)
    elapsed = time.perf_counter() - started
    assert grammar.relaxed and grammar.prefix_checks is not None
    assert len(grammar.prefix_checks.rules) <= json_relax._MAX_RULES
    assert visits[0] <= _nodes(schema) + 1
    assert elapsed < 10.0


def _slow_engine(monkeypatch, delay: float):
    """``_compile`` that sleeps ``delay`` first (a native compile that releases the GIL);
    returns its call log, the switch that makes it fast again, and an event set whenever
    a call has returned or raised."""
    calls: list[float] = []
    slow, ended = threading.Event(), threading.Event()
    slow.set()
    compile_ = grammar_compile._compile

    def sleepy(schema, options, stop=None):
        calls.append(time.perf_counter())
        if slow.is_set():
            time.sleep(delay)
        try:
            return compile_(schema, options, stop)
        finally:
            ended.set()

    monkeypatch.setattr(grammar_compile, "_compile", sleepy)
    return calls, slow, ended


def test_compile_timeout_fires_with_the_schema_size_and_caches_nothing(monkeypatch):
    schema = {"type": "object", "properties": {"slow_pw": {"type": "string", "pattern": LOOK}}}
    calls, slow, ended = _slow_engine(monkeypatch, 0.8)
    started = time.perf_counter()
    with pytest.raises(CompileTimeout) as info:
        json_grammar(schema, compile_timeout=0.2)
    assert time.perf_counter() - started < 0.6  # the caller is back at the bound
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    for words in ("compile_timeout=0.2 s", "3 nodes", "bytes of JSON", "0 definitions"):
        assert words in message, message
    assert ended.wait(10.0)  # the abandoned compile wakes and sees it was given up
    time.sleep(0.1)
    assert len(calls) == 1  # no further tier ran
    slow.clear()
    grammar = json_grammar(schema, compile_timeout=None)  # compiled now: nothing was cached
    assert isinstance(grammar, Grammar) and len(calls) > 1
    assert json_grammar(schema, compile_timeout=0.2) is grammar  # cached, returned at once


def test_from_json_schema_takes_the_bound(monkeypatch):
    _slow_engine(monkeypatch, 0.5)
    with pytest.raises(CompileTimeout, match="compile_timeout=0.1 s"):
        Grammar.from_json_schema({"type": "string", "maxLength": 77}, compile_timeout=0.1)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "1"])
def test_compile_timeout_is_validated(bad):
    with pytest.raises(ValueError, match="compile_timeout must be a positive number"):
        json_grammar({"type": "integer"}, compile_timeout=bad)


def test_engine_refusals_still_reach_the_caller_through_the_worker():
    with pytest.raises(ValueError, match="Unsatisfiable") as info:
        json_grammar({"type": "integer", "minimum": 5, "maximum": 3}, compile_timeout=5.0)
    assert not isinstance(info.value, CompileTimeout)


def test_a_thousand_deep_reference_chain_compiles():
    # llguidance's compile recurses per $ref hop: on a default 8 MB thread stack this
    # chain is a segfault; the compile worker's stack takes it
    defs = {
        f"d{i}": {
            "type": "object",
            "properties": {"s": {"type": "string"}, "next": {"$ref": f"#/$defs/d{i + 1}"}},
        }
        for i in range(999)
    }
    defs["d999"] = {"type": "string"}
    grammar = json_grammar({"$defs": defs, "$ref": "#/$defs/d0"}, compile_timeout=10.0)
    assert grammar.check('{"s":"a","next":{"s":"b"}}')
    assert not grammar.check('{"next":{"next":"d2 is an object"}}')
