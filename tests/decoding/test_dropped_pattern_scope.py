"""A dropped pattern is a prefix check only where it applies to every string at its path.

Schemas whose lookahead ``pattern`` llguidance cannot parse compile through the stripped
tier (:mod:`llamppl.decoding.grammar.json_relax`); the pattern comes back as a prefix check
(:class:`~llamppl.decoding.grammar.json_patterns.JSONStringPatterns`) only where it holds for
every string value at the path: never under ``anyOf`` / ``oneOf`` branches,
``if`` / ``then`` / ``else``, ``not``, ``patternProperties``, ``dependentSchemas``,
``contains``, ``unevaluatedProperties``, on declared keys through ``additionalProperties``,
at positions another keyword covers, through references into other resources, or on
siblings a draft ignores. Each case lists by hand the texts the schema accepts and those
it rejects: the compiled grammar (through :func:`json_grammar`), with its prefix check,
must let every valid text through character by character and accept it at the end, and
must not accept an invalid one; where the pattern is unconditional the prefix check must
still refuse early (the hand-written prefix).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("llguidance", reason="needs llguidance (dev extra)")
pytest.importorskip("jsonschema")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grammar_walk import walk  # noqa: E402

from llamppl.decoding.grammar.compile import json_grammar  # noqa: E402
from llamppl.decoding.grammar.json_relax import (  # noqa: E402
    AnyIndex,
    AnyKey,
    rule_matches,
    strip_unsupported,
)

A = "^(?=a)"  # a lookahead: llguidance refuses it; the string starts with "a"
X = "^(?=x)"
DRAFT7 = "http://json-schema.org/draft-07/schema#"


def _no_lookaround(pattern: str) -> bool:
    return "(?" not in pattern


# name: (schema, dropped (path, pattern) pairs, valid texts, invalid texts, refused prefix)
CASES = {
    "anyOf": (
        {"type": "string", "anyOf": [{"pattern": A}, {"maxLength": 1}]},
        [],
        ['"b"', '"a"', '"abc"'],
        ['"bc"'],
        None,
    ),
    "oneOf": (
        {"type": "string", "oneOf": [{"pattern": A}, {"maxLength": 1}]},
        [],
        ['"b"', '"abc"'],
        ['"a"', '"bc"'],  # both branches; neither
        None,
    ),
    "one_branch_anyOf": (
        {"anyOf": [{"type": "string", "pattern": A}]},
        [((), A)],
        ['"a"', '"ab"'],
        ['"b"'],
        '"b',
    ),
    "additionalProperties_beside_properties": (
        {
            "type": "object",
            "properties": {"a": {"type": "string"}},
            "additionalProperties": {"type": "string", "pattern": X},
        },
        [((AnyKey(frozenset({"a"})),), X)],
        ['{"a":"b"}', '{"a":"b","c":"x1"}', '{"\\u0061":"b"}'],  # an escaped "a" is "a"
        ['{"c":"b"}', '{"a":"b","c":"y"}'],
        '{"c":"b',
    ),
    "additionalProperties_beside_patternProperties": (
        {
            "type": "object",
            "patternProperties": {"^p": {"type": "string"}},
            "additionalProperties": {"type": "string", "pattern": X},
        },
        [],
        ['{"pa":"b"}', '{"q":"x"}'],
        ['{"q":"b"}'],
        None,
    ),
    "additionalProperties_alone_covers_every_key": (
        {
            "allOf": [
                {"properties": {"a": {"type": "string"}}},
                {"type": "object", "additionalProperties": {"type": "string", "pattern": X}},
            ]
        },
        [((AnyKey(),), X)],  # no properties beside it: "a" is an additional key here
        ['{"a":"x"}', '{"b":"xy"}'],
        ['{"a":"b"}'],
        '{"a":"b',
    ),
    "property_named_like_a_wildcard": (
        {"type": "object", "properties": {"*": {"type": "string", "pattern": X}}},
        [(("*",), X)],
        ['{"a":"b"}', '{"*":"x"}'],
        ['{"*":"b"}'],
        '{"*":"b',
    ),
    "key_0_is_not_position_0": (
        {"type": ["object", "array"], "properties": {"0": {"type": "string", "pattern": X}}},
        [(("0",), X)],
        ['["b"]', '{"0":"x"}'],
        ['{"0":"b"}'],
        '{"0":"b',
    ),
    "items_are_not_object_values": (
        {"type": ["object", "array"], "items": {"type": "string", "pattern": X}},
        [((AnyIndex(0),), X)],
        ['{"a":"b"}', '["x","xy"]'],
        ['["x","b"]'],
        '["x","b',
    ),
    "prefixItems": (
        {
            "type": "array",
            "prefixItems": [{"type": "string", "pattern": A}],
            "items": {"type": "string"},
        },
        [((0,), A)],
        ['["a","b"]', '["ab"]'],
        ['["b"]', '["b","a"]'],
        '["b',
    ),
    "items_after_prefixItems": (
        {
            "type": "array",
            "prefixItems": [{"type": "string"}],
            "items": {"type": "string", "pattern": X},
        },
        [((AnyIndex(1),), X)],
        ['["b"]', '["b","x"]'],
        ['["b","b"]'],
        '["b","b',
    ),
    "draft7_items_array_and_additionalItems": (
        {
            "$schema": DRAFT7,
            "type": "array",
            "items": [{"type": "string", "pattern": A}],
            "additionalItems": {"type": "string", "pattern": X},
        },
        [((0,), A), ((AnyIndex(1),), X)],
        ['["a"]', '["a","x"]'],
        ['["b"]', '["a","b"]'],
        '["a","b',
    ),
    "additionalItems_without_an_items_array": (
        {"type": "array", "additionalItems": {"type": "string", "pattern": X}},
        [],  # Draft 2020-12 has no additionalItems; older drafts read it only after an array
        ['["b"]'],
        ['"b"'],
        None,
    ),
    "draft7_prefixItems_is_not_a_keyword": (
        {"$schema": DRAFT7, "type": "array", "prefixItems": [{"type": "string", "pattern": A}]},
        [],
        ['["b"]', '["a"]'],
        ["{}"],
        None,
    ),
    "draft7_ref_hides_its_siblings": (
        {
            "$schema": DRAFT7,
            "definitions": {"s": {"type": "string"}},
            "$ref": "#/definitions/s",
            "pattern": A,
        },
        [],
        ['"b"', '"a"'],
        ["1"],
        None,
    ),
    "draft2020_ref_keeps_its_siblings": (
        {"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "pattern": A},
        [((), A)],
        ['"a"'],
        ['"b"'],
        '"b',
    ),
    "if_then_else": (
        {
            "type": "string",
            "if": {"maxLength": 1},
            "then": {"pattern": A},
            "else": {"pattern": "^(?=b)"},
        },
        [],
        ['"a"', '"bc"'],
        ['"b"', '"ac"'],
        None,
    ),
    "not": (
        {"type": "string", "not": {"pattern": A}},
        [],
        ['"b"'],
        ['"a"', '"ab"'],
        None,
    ),
    "patternProperties": (
        {"type": "object", "patternProperties": {"^p": {"type": "string", "pattern": A}}},
        [],
        ['{"q":"b"}', '{"p":"a"}'],
        ['{"p":"b"}'],
        None,
    ),
    "dependentSchemas": (
        {
            "type": "object",
            "dependentSchemas": {"k": {"properties": {"s": {"type": "string", "pattern": A}}}},
        },
        [],
        ['{"s":"b"}', '{"k":1,"s":"a"}'],
        ['{"k":1,"s":"b"}'],
        None,
    ),
    "draft7_dependencies": (
        {
            "$schema": DRAFT7,
            "type": "object",
            "dependencies": {"k": {"properties": {"s": {"type": "string", "pattern": A}}}},
        },
        [],
        ['{"s":"b"}', '{"k":1,"s":"a"}'],
        ['{"k":1,"s":"b"}'],
        None,
    ),
    "contains": (
        {"type": "array", "contains": {"type": "string", "pattern": A}},
        [],
        ['["b","a"]', '["a"]'],
        ['["b"]', "[]"],
        None,
    ),
    "unevaluatedProperties": (
        {
            "type": "object",
            "properties": {"a": {"type": "string"}},
            "unevaluatedProperties": {"type": "string", "pattern": X},
        },
        [],
        ['{"a":"b"}', '{"c":"x"}'],
        ['{"c":"b"}'],
        None,
    ),
    "propertyNames": (
        {"type": "object", "propertyNames": {"pattern": A}},
        [],
        ['{"a":"b"}', "{}"],
        ['{"b":"a"}'],
        None,
    ),
    "reference_into_another_resource": (
        {
            "$defs": {
                "s": {"type": "string", "pattern": A},
                "inner": {
                    "$id": "https://example.com/inner",
                    "$defs": {"s": {"type": "string"}, "t": {"$ref": "#/$defs/s"}},
                    "$ref": "#/$defs/s",  # the inner resource's s: any string
                },
            },
            "type": "object",
            "properties": {
                "v": {"$ref": "#/$defs/inner"},
                "u": {"$ref": "#/$defs/inner/$defs/t"},  # through it: t's s is inner's too
                "w": {"$ref": "#/$defs/s"},
            },
        },
        [(("w",), A)],
        ['{"v":"b"}', '{"v":"b","w":"a"}', '{"u":"b"}'],
        ['{"w":"b"}'],
        '{"w":"b',
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_dropped_patterns_are_collected_only_where_unconditional(name):
    schema, dropped, _, _, _ = CASES[name]
    assert strip_unsupported(schema, _no_lookaround)[1] == dropped


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_compiled_grammar_accepts_exactly_the_valid_texts(name):
    schema, dropped, valid, invalid, refused = CASES[name]
    grammar = json_grammar(schema)
    rules = [] if grammar.prefix_checks is None else grammar.prefix_checks.rules
    assert [(path, pattern.pattern) for path, pattern in rules] == dropped
    for text in valid:
        assert grammar.check(text), (text, grammar.check.last_error)  # the hand answer
        assert walk(grammar, text) is True, text
    for text in invalid:
        assert not grammar.check(text), text
        assert walk(grammar, text) is not True, text
    if refused is not None:  # an unconditional pattern still guides: refused at its end
        assert walk(grammar, refused) == len(refused) - 1


def test_cases_reach_the_stripped_tier_where_a_pattern_is_collected():
    for name, (schema, dropped, *_) in CASES.items():
        if dropped:
            assert len(json_grammar(schema).relaxed) == 2, name  # exact, relaxed refused


def test_rule_steps_tell_keys_from_positions():
    assert rule_matches(("*",), ("*",)) and not rule_matches(("*",), ("a",))
    assert rule_matches((0,), (0,)) and not rule_matches((0,), ("0",))
    assert rule_matches(("0",), ("0",)) and not rule_matches(("0",), (0,))
    assert rule_matches((AnyKey(frozenset({"a"})),), ("b",))
    assert not rule_matches((AnyKey(frozenset({"a"})),), ("a",))
    assert not rule_matches((AnyKey(),), (0,)) and not rule_matches((AnyIndex(),), ("a",))
    assert rule_matches((AnyIndex(2),), (2,)) and not rule_matches((AnyIndex(2),), (1,))
    assert not rule_matches(("a",), ("a", 0))


@pytest.mark.parametrize(
    "schema, dropped",
    [
        # a percent-encoded pointer names the key it decodes to
        ({"$defs": {"a b": {"type": "string", "pattern": A}}, "$ref": "#/$defs/a%20b"}, [((), A)]),
        # an anchor is not followed (it may name any node)
        ({"$defs": {"s": {"$anchor": "s", "type": "string", "pattern": A}}, "$ref": "#s"}, []),
        # a subschema with its own $schema reads as another draft: not entered
        ({"properties": {"a": {"$schema": DRAFT7, "type": "string", "pattern": A}}}, []),
        # https is not the draft-07 URI jsonschema knows: Draft 2020-12, siblings read
        (
            {
                "$schema": "https://json-schema.org/draft-07/schema#",
                "$defs": {"s": {"type": "string"}},
                "$ref": "#/$defs/s",
                "pattern": A,
            },
            [((), A)],
        ),
        # Draft 2019-09: items arrays and additionalItems, $ref siblings read
        (
            {
                "$schema": "https://json-schema.org/draft/2019-09/schema",
                "items": [{"type": "string"}, {"$ref": "#/$defs/s", "pattern": A}],
                "additionalItems": {"type": "string", "pattern": X},
                "$defs": {"s": {"type": "string"}},
            },
            [((1,), A), ((AnyIndex(2),), X)],
        ),
    ],
)
def test_references_and_drafts_are_read_as_the_validator_reads_them(schema, dropped):
    assert strip_unsupported(schema, _no_lookaround)[1] == dropped


def test_a_validator_not_known_to_the_walk_gets_no_prefix_check():
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": A}}}
    assert strip_unsupported(schema, _no_lookaround)[1] == [(("a",), A)]
    assert strip_unsupported(schema, _no_lookaround, draft="MyValidator")[1] == []
