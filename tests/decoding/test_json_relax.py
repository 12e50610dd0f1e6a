"""Schemas llguidance refuses compile to a superset grammar, and the program stays exact.

Each refused kind (a lookaround or backreference ``pattern``, ``patternProperties`` with
one, sibling keys of a circular ``$ref``) must compile; ``GrammarConstraint`` on it must
give exactly the brute-force conditional of the LM given jsonschema validity; dropped
patterns come back as a prefix check on their strings; unsatisfiable and unresolvable
schemas are still refused with llguidance's words. Patterns reached through shared and
recursive definitions get the path of every use (written out by hand on small cases), and
the memoised walk that collects them lists exactly what following every ``$ref`` again at
each use lists, on random schemas whose definitions refer to each other.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("llguidance", reason="needs llguidance (dev extra)")
jsonschema = pytest.importorskip("jsonschema")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "models"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from grammar_lms import assert_exact, brute_force, wavy_lm  # noqa: E402
from grammar_walk import walk  # noqa: E402

from llamppl.decoding.grammar.compile import json_grammar  # noqa: E402
from llamppl.decoding.grammar.json_patterns import JSONStringPatterns, string_values  # noqa: E402
from llamppl.decoding.grammar.json_relax import AnyIndex, AnyKey, strip_unsupported  # noqa: E402
from llamppl.models import GrammarConstraint  # noqa: E402

STRINGS = ["<s>", '"', "a", "b", "ab", "<eos>"]
OBJECTS = ["<s>", "{", "}", '"x":1', '"y":1', '"n":', "null", ",", "<eos>"]

REFUSED = {
    "backreference": {"type": "string", "pattern": "^(a)\\1$"},
    "lookahead": {"type": "string", "pattern": "^(?=.*b)[ab]{1,3}$"},
    "pattern_properties": {
        "type": "object",
        "patternProperties": {"^(?!y)": {"type": "integer"}},
        "additionalProperties": False,
    },
    "circular_ref_with_siblings": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "n": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node", "minProperties": 1}]}
                },
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    },
}


# The toy vocabularies have no ":" token. Where the grammar forces ":" (after a key),
# llguidance's mask lists the tokens that may follow the forced byte, so a particle there
# draws one, the engine rejects it, and the particle dies with a RuntimeWarning. Its weight
# is zero, so the results stay exact; real tokenizers have every byte as a token.
_NO_COLON_TOKEN = pytest.mark.filterwarnings("ignore:llguidance failed:RuntimeWarning")


def _valid(schema):
    def ok(text: str) -> bool:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return False
        return jsonschema.Draft202012Validator(schema).is_valid(value)

    return ok


@pytest.mark.parametrize("name", sorted(REFUSED))
@_NO_COLON_TOKEN
def test_refused_schemas_compile_to_a_superset_and_stay_exact(name):
    schema = REFUSED[name]
    grammar = json_grammar(schema)
    assert grammar.relaxed  # the exact compiler refused it
    vocab = OBJECTS if schema.get("type") != "string" else STRINGS
    log_z, post = brute_force(vocab, _valid(schema), 5)
    model = GrammarConstraint(wavy_lm(vocab), [], grammar=grammar, max_tokens=5)
    assert_exact(model, log_z, post)


@_NO_COLON_TOKEN
def test_dropped_patterns_are_checked_on_their_strings():
    schema = {
        "type": "object",
        "properties": {"pw": {"type": "string", "pattern": "^(?=.*1)[a-z1]{2,}$"}},
    }
    grammar = json_grammar(schema)
    checks = grammar.prefix_checks
    assert isinstance(checks, JSONStringPatterns)
    assert checks('{"pw":"ab') and checks('{"pw":"a1"') and not checks('{"pw":"ab"')
    vocab = ["<s>", "{", "}", '"pw":"', "a", "1", '"', "<eos>"]
    model = GrammarConstraint(wavy_lm(vocab), [], json_schema=schema, max_tokens=6)
    assert model.proposal == "lazy"  # the pattern check is Python: checked on drawn tokens
    log_z, post = brute_force(vocab, _valid(schema), 6)
    assert_exact(model, log_z, post)


def test_string_values_report_paths_content_and_closure():
    text = '{"a":["x\\"y",{"b":"z'
    assert list(string_values(text)) == [
        (("a", 0), 'x"y', True),
        (("a", 1, "b"), "z", False),
    ]
    assert list(string_values('[["p",{"\\u0071":"r"}],"s"]')) == [
        ((0, 0), "p", True),
        ((0, 1, "q"), "r", True),  # keys decoded
        ((1,), "s", True),
    ]


def test_strip_keeps_what_the_engine_parses_and_records_paths():
    schema = {
        "type": "object",
        "properties": {
            "ok": {"type": "string", "pattern": "^[a-z]+$"},
            "bad": {"type": "array", "items": {"type": "string", "pattern": "^(a)\\1"}},
        },
    }
    stripped, dropped = strip_unsupported(schema, lambda p: "\\1" not in p)
    assert stripped["properties"]["ok"]["pattern"] == "^[a-z]+$"
    assert "pattern" not in stripped["properties"]["bad"]["items"]
    assert dropped == [(("bad", AnyIndex(0)), "^(a)\\1")]


LOOK_B = "^(?=b)"  # makes the schemas below reach the stripped tier


@pytest.mark.parametrize(
    "schema, text",
    [
        # a const object with a "pattern" key is data, not a schema
        (
            {"anyOf": [{"type": "string", "pattern": LOOK_B}, {"const": {"pattern": "(?=a)"}}]},
            '{"pattern":"(?=a)"}',
        ),
        # an enum value with a "$ref" key keeps its other keys
        (
            {"anyOf": [{"type": "string", "pattern": LOOK_B}, {"enum": [{"$ref": "#/x", "k": 1}]}]},
            '{"$ref":"#/x","k":1}',
        ),
        # a property named "$ref" is not a reference: the other properties stay
        (
            {
                "type": "object",
                "properties": {
                    "$ref": {"type": "integer"},
                    "a": {"type": "string", "pattern": LOOK_B},
                },
                "required": ["a"],
                "additionalProperties": False,
            },
            '{"$ref":1,"a":"b"}',
        ),
    ],
)
def test_stripping_never_narrows_the_valid_texts(schema, text):
    grammar = json_grammar(schema)
    assert len(grammar.relaxed) == 2  # the stripped tier
    assert grammar.check(text)
    assert walk(grammar, text) is True


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"type": "integer", "minimum": 5, "maximum": 3}, "Unsatisfiable"),
        ({"$ref": "#/$defs/missing"}, "does not exist"),
    ],
)
def test_unsatisfiable_and_unresolvable_schemas_keep_their_refusal(schema, words):
    with pytest.raises(ValueError, match=words):
        json_grammar(schema)


# ---------------------------------------------------------------- dropped patterns through $ref
LOOK = "^(?=.*1)[a-z1]{2,}$"


def _no_lookaround(pattern: str) -> bool:
    return "(?" not in pattern


def test_dropped_patterns_through_shared_definitions_get_every_use_path():
    schema = {
        "$defs": {
            "pw": {"type": "string", "pattern": LOOK},
            "pair": {
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/pw"}, "b": {"$ref": "#/$defs/pw"}},
            },
        },
        "type": "object",
        "properties": {
            "x": {"$ref": "#/$defs/pair"},
            "y": {"type": "array", "items": {"$ref": "#/$defs/pair"}},
            "z": {"anyOf": [{"$ref": "#/$defs/pw"}, {"type": "null"}]},  # conditional
            "w": {"oneOf": [{"$ref": "#/$defs/pair"}]},  # one branch: unconditional
        },
    }
    _, dropped = strip_unsupported(schema, _no_lookaround)
    assert dropped == [
        (("x", "a"), LOOK),
        (("x", "b"), LOOK),
        (("y", AnyIndex(0), "a"), LOOK),
        (("y", AnyIndex(0), "b"), LOOK),
        (("w", "a"), LOOK),
        (("w", "b"), LOOK),
    ]


def test_a_recursive_definition_is_unrolled_max_depth_references_deep():
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "pattern": LOOK},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
            }
        },
        "$ref": "#/$defs/node",
    }
    _, dropped = strip_unsupported(schema, _no_lookaround)
    # the root's $ref is the first of the 12 references a path may follow
    assert dropped == [((("kids", AnyIndex(0)) * k) + ("name",), LOOK) for k in range(12)]


def test_regex_ok_is_asked_once_per_distinct_pattern():
    asked: list[str] = []

    def regex_ok(pattern: str) -> bool:
        asked.append(pattern)
        return _no_lookaround(pattern)

    props = {f"p{i}": {"type": "string", "pattern": LOOK if i % 2 else "^a+$"} for i in range(20)}
    strip_unsupported({"type": "object", "properties": props}, regex_ok)
    assert sorted(asked) == sorted([LOOK, "^a+$"])


def _pointer(root, ref):
    """The node a ``#/a/b`` reference names (the test schemas use plain names only)."""
    node = root
    for part in ref[2:].split("/") if ref != "#" else []:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _unrolled_pairs(schema, regex_ok, max_depth):
    """The dropped pairs by following every $ref again at each use (the walk before the
    memo, exponential in the depth), through the keywords that apply unconditionally in
    Draft 2020-12: the reference the memoised walk must reproduce."""
    root = schema if isinstance(schema, dict) else {}
    out = []

    def collect(node, path, depth):
        if not isinstance(node, dict) or depth > max_depth:
            return
        if isinstance(node.get("pattern"), str) and not regex_ok(node["pattern"]):
            out.append((path, node["pattern"]))
        if isinstance(node.get("$ref"), str):
            collect(_pointer(root, node["$ref"]), path, depth + 1)
        for sub in node.get("allOf", []):
            collect(sub, path, depth)
        for key in ("anyOf", "oneOf"):
            if len(node.get(key, [])) == 1:
                collect(node[key][0], path, depth)
        props = node.get("properties", {})
        for name, sub in props.items():
            collect(sub, path + (name,), depth)
        if "additionalProperties" in node and "patternProperties" not in node:
            collect(node["additionalProperties"], path + (AnyKey(frozenset(props)),), depth)
        for i, sub in enumerate(node.get("prefixItems", [])):
            collect(sub, path + (i,), depth)
        if "items" in node:
            start = len(node.get("prefixItems", []))
            collect(node["items"], path + (AnyIndex(start),), depth)

    collect(root, (), 0)
    return list(dict.fromkeys(out))


def _random_schema(rng, n_defs):
    """A small schema whose definitions refer to each other (cycles included), with
    conditional places (two-branch anyOf/oneOf, additionalProperties beside
    patternProperties) and unconditional ones."""
    patterns = [LOOK, "^a+$", "(a)\\1", "^(?!b)"]

    def node(depth):
        kinds = ["string", "ref", "ref", "object", "object", "map", "array", "tuple"]
        kind = rng.choice(kinds + ["anyOf", "oneOf", "allOf", "one"])
        if depth > 2 or kind == "string":
            return {"type": "string", "pattern": rng.choice(patterns)}
        if kind == "ref":
            return {"$ref": f"#/$defs/d{rng.randrange(n_defs)}"}
        if kind == "object":
            names = rng.sample("abcd", rng.randint(1, 3))
            out = {"type": "object", "properties": {k: node(depth + 1) for k in names}}
            if rng.random() < 0.5:
                out["additionalProperties"] = node(depth + 1)
            return out
        if kind == "map":
            out = {"type": "object", "additionalProperties": node(depth + 1)}
            if rng.random() < 0.5:
                out["patternProperties"] = {"^p": {"type": "string"}}
            return out
        if kind == "array":
            return {"type": "array", "items": node(depth + 1)}
        if kind == "tuple":
            prefix = [node(depth + 1) for _ in range(rng.randint(1, 2))]
            return {"type": "array", "prefixItems": prefix, "items": node(depth + 1)}
        if kind == "one":
            return {rng.choice(["anyOf", "oneOf"]): [node(depth + 1)]}
        return {kind: [node(depth + 1), node(depth + 1)]}

    defs = {f"d{i}": node(0) for i in range(n_defs)}
    return {"$defs": defs, **node(0)}


@pytest.mark.parametrize("max_rules", [5, 256])
def test_memoised_walk_reproduces_the_unrolled_walk(monkeypatch, max_rules):
    import random

    from llamppl.decoding.grammar import json_relax

    monkeypatch.setattr(json_relax, "_MAX_DEPTH", 4)  # keeps the unrolled reference small
    monkeypatch.setattr(json_relax, "_MAX_RULES", max_rules)
    rng = random.Random(7)
    for _ in range(150):
        schema = _random_schema(rng, rng.randint(1, 4))
        expected = _unrolled_pairs(schema, _no_lookaround, 4)[:max_rules]
        assert strip_unsupported(schema, _no_lookaround)[1] == expected, schema
