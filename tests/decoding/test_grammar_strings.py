"""Grammars judge strings: ``accepts_prefix`` / ``accepts_end`` with no LM, as the token walk does.

Each grammar kind (regex, Lark, JSON Schema exact and relaxed, Pydantic) is judged on seeded
random texts near its language, and the verdicts are compared with the token-level walk
(``start`` / ``allows`` / ``advance`` / ``ends``) of random spellings on a FunctionLM whose
tokens are characters and pieces of 2-4 characters. Then the wrong answers MaskBench found,
one test each, the engine limits, the key order and the formats.
"""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("llguidance")
pytest.importorskip("jsonschema")

from string_walks import assert_agree, chunk_lm, random_texts, token_walk  # noqa: E402

import llamppl.decoding.grammar.matcher as matcher_module  # noqa: E402
from llamppl import FunctionLM  # noqa: E402
from llamppl.constraints import ConstraintFailure, Grammar, JSONBudget  # noqa: E402
from llamppl.decoding.grammar.json_formats import check_format  # noqa: E402

OPEN = JSONBudget(
    whitespace="flexible",
    max_string_length=None,
    max_array_items=None,
    closed_objects=False,
    max_decimals=None,
)
ARITHMETIC = r"""
start: expr
expr: term (("+" | "-") term)*
term: NUMBER | "(" expr ")"
NUMBER: /[1-9][0-9]{0,2}|0/
"""
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"enum": ["a", "bc"]}},
    },
    "required": ["name"],
}
ONE_OF = {"oneOf": [{"type": "integer", "maximum": 5}, {"type": "integer", "minimum": 3}]}


def _cases():
    from pydantic import BaseModel

    class Point(BaseModel):
        x: int
        label: str

    person = ['{"name":"Ann","age":30,"tags":["a","bc"]}', '{"name":"Bo"}', '{"name":"","age":0}']
    return [
        ("regex", Grammar.from_regex("(ab|b)+c"), ["abbc", "bc", "ababc"]),
        ("lark", Grammar.from_lark(ARITHMETIC), ["1+(2-30)", "(10)", "7-0"]),
        ("json exact", Grammar.from_json_schema(PERSON), person),
        (
            "json open",
            Grammar.from_json_schema(PERSON, budget=OPEN),
            [*person, '{ "name" : "Al", "age": 2.0e1 }'],
        ),
        ("json relaxed", Grammar.from_json_schema(ONE_OF), ["1", "4", "40", "-2"]),
        (
            "pydantic",
            Grammar.from_json_schema(Point),
            ['{"x":1,"label":"p"}', '{"x":-20,"label":""}'],
        ),
    ]


@pytest.mark.parametrize("case", range(6))
def test_verdicts_are_the_token_walks(case):
    name, grammar, seeds = _cases()[case]
    rng = random.Random(case)
    texts = random_texts(seeds, rng, 80, extra='{}[]",:0 ')
    lm = chunk_lm(texts, rng)
    prefixes, ends = assert_agree(grammar, texts, lm, rng)
    assert 0 < ends < prefixes < len(texts), (name, prefixes, ends)  # both verdicts occur


def test_a_conjunction_and_the_prefix_checks_judge_with_every_part():
    grammar = Grammar.from_json_schema(
        {"type": "object", "properties": {"pw": {"type": "string", "pattern": "^(?=.*1)[a-z1]+$"}}}
    )
    assert grammar.prefix_checks is not None  # the lookaround went to a Python check
    both = grammar & grammar.prefix_checks & (lambda text: "z" not in text)
    rng = random.Random(7)
    texts = random_texts(['{"pw":"ab1"}', '{"pw":"1"}', '{"pw":"zz1"}'], rng, 60)
    assert_agree(both, texts, chunk_lm(texts, rng), rng)
    assert grammar.accepts_end('{"pw":"ab"}') is False  # the final check: no digit
    assert grammar.accepts_prefix('{"pw":"ab"}') is True  # the engine alone: a prefix
    assert both.accepts_prefix('{"pw":"ab"}') is False  # the pattern's prefix check
    assert grammar('{"pw"') and not grammar('{"pw" x')  # calling a grammar: accepts_prefix


@pytest.mark.parametrize(
    ("schema", "valid", "invalid"),
    [
        # relaxed tier: lenient minProperties would ask for an unlisted key
        ({"properties": {"d": {}, "f": {}}, "minProperties": 1}, ['{"d": "a"}'], ["{}"]),
        # whole-number floats
        ({"enum": [2.0]}, ["2.0", "2", "2.00"], ["3", "2.5"]),
        ({"const": 1}, ["1.0", "1"], ["1.5"]),
        ({"type": "integer", "maximum": 3}, ["1.0", "3"], ["1.5", "4"]),
        # exponents in a bounded number
        (
            {"type": "number", "minimum": 0, "maximum": 1},
            ["1e-06", "0.5", "1E-6"],
            ["2e0", "-1e-06"],
        ),
        # a string may spell a character as \uXXXX
        ({"type": "string"}, ['"\\u00e9t\\u00e9"', '"été"'], ['"\\u00e"']),
    ],
)
def test_the_wrong_answers_maskbench_found_are_right(schema, valid, invalid):
    grammar = Grammar.from_json_schema(schema, budget=OPEN)
    assert [grammar.accepts_end(t) for t in valid] == [True] * len(valid)
    assert [grammar.accepts_end(t) for t in invalid] == [False] * len(invalid)


def test_integers_are_digits_alone_in_draft_4():
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}
    grammar = Grammar.from_json_schema(schema, budget=OPEN)
    assert grammar.accepts_end("3") and not grammar.accepts_end("3.0")  # 3.0 is no Draft 4 integer


DRAFT7_REF = {
    "definitions": {"workflow": {"properties": {"id": {"type": "string"}}}},
    "type": "object",
    "properties": {"workflow": {"$ref": "#/definitions/workflow", "required": ["configuration"]}},
}


@pytest.mark.parametrize(
    ("draft", "reads_siblings"),
    [
        ("http://json-schema.org/draft-07/schema#", False),
        ("http://json-schema.org/draft-04/schema#", False),
        (None, True),
    ],
)
def test_grammar_and_check_read_ref_siblings_as_the_draft_does(draft, reads_siblings):
    schema = dict(DRAFT7_REF, **({"$schema": draft} if draft else {}))
    grammar = Grammar.from_json_schema(schema, budget=OPEN)
    text = '{"workflow": {"id": "w"}}'
    assert grammar.accepts_end(text) is (not reads_siblings)
    assert grammar.check(text) is (not reads_siblings)  # grammar and check agree


def test_engine_limits_are_per_matcher_and_never_sticky(monkeypatch):
    """A lexer that runs out of work budget fails its walk with the engine's error, the next
    walk, token-level or string, starts afresh (it used to refuse the first '{'), and once
    the budget is back the same grammar judges the text."""
    pattern = "^(?:\\S+\\s+){0,19}\\S+$"
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": pattern, "maxLength": 200}},
    }
    text = '{"a":"Monday to Friday, 9am to 5pm, and more words here"}'
    with monkeypatch.context() as patch:
        patch.setitem(matcher_module.ENGINE_LIMITS, "initial_lexer_fuel", 200_000)
        grammar = Grammar.from_json_schema(schema)
        for _ in range(2):
            with pytest.raises(ConstraintFailure, match="lexer error"):
                grammar.accepts_end(text)
        assert grammar.accepts_prefix('{"a":"Mon')  # a short walk stays within the budget
        vocab = ["<s>", *sorted(set(text)), "</s>"]
        lm = FunctionLM(vocab, len(vocab) - 1, lambda ctx: [0.0] * len(vocab), bos_token_id=0)
        tokens = [vocab.index(ch) for ch in text]
        reached = []
        for _ in range(2):  # the same walk twice on one LM: same place, same cause
            state = grammar.start(lm)
            with pytest.raises(ConstraintFailure, match="lexer error") as info:
                for i, token in enumerate(tokens):
                    reached.append(i)
                    if grammar.allows(lm, state, token):
                        state = grammar.advance(lm, state, token)
            assert info.value.cause.startswith("grammar engine: lexer error")
        first, second = reached[: len(reached) // 2], reached[len(reached) // 2 :]
        assert first == second and len(first) > 10
    assert grammar.accepts_end(text)  # the library's own budget: nothing stuck


def test_key_order_is_a_stated_option():
    schema = {
        "type": "object",
        "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
        "required": ["a", "c"],
    }
    fixed = Grammar.from_json_schema(schema, budget=OPEN)
    free = Grammar.from_json_schema(
        schema, budget=JSONBudget(**{**OPEN.__dict__, "key_order": "any"})
    )
    value = {"z": 0, "c": 1, "a": 2, "b": 3}
    assert list(fixed.order_keys(value)) == ["b", "a", "c", "z"]  # properties, required, others
    assert fixed.accepts_end(json.dumps(fixed.order_keys(value)))
    assert not fixed.accepts_end(json.dumps(value))
    assert free.accepts_end(json.dumps(value)) and free.order_keys(value) == value
    assert not free.accepts_end('{"a": 1, "b": 2}')  # "c" is required
    assert not free.accepts_end('{"a": 1, "c": 2, "a": 1}')  # a key written twice
    with pytest.raises(ValueError, match="key_order"):
        JSONBudget(key_order="sorted")


def test_the_key_order_follows_the_schemas_keyword_order():
    """The compiler reads a node's keywords in order: a oneOf before properties puts the
    branch's keys first; additionalProperties carries the node's property names."""
    schema = {
        "additionalProperties": False,
        "oneOf": [{"properties": {"kind": {"const": "x"}}, "required": ["kind"]}],
        "properties": {"id": {"type": "integer"}, "kind": {"type": "string"}},
    }
    grammar = Grammar.from_json_schema(schema, budget=OPEN)
    value = {"kind": "x", "id": 1}
    assert list(grammar.order_keys(value)) == ["id", "kind"]
    assert grammar.accepts_end(json.dumps(grammar.order_keys(value)))
    late = {"oneOf": schema["oneOf"], "properties": {"id": {"type": "integer"}}}
    grammar = Grammar.from_json_schema(late, budget=OPEN)
    assert list(grammar.order_keys({"id": 1, "kind": "x"})) == ["kind", "id"]
    assert grammar.accepts_end('{"kind": "x", "id": 1}')


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [
        ("uri", "https://example.com/a?b=1#c", "www.example.com/page"),
        ("uri-reference", "../a/b?c", "http://exa mple.com"),
        ("iri", "https://例え.jp/パス", "例え.jp"),
        ("iri-reference", "パス/a", "a b"),
        (
            "uri-template",
            "https://api.example.com/{user}/repos{?page}",
            "https://api.example.com/{user",
        ),
        ("duration", "P1Y2M3DT4H5M6S", "1 day"),
        ("date-time", "2024-02-29T10:00:00.5+01:00", "2023-02-29T10:00:00Z"),
        ("time", "23:59:60Z", "10:00:00"),
        ("email", "a.b@example.com", "a.b@"),
        ("hostname", "my-host.example", "-host.example"),
        ("json-pointer", "/a/~1b", "a/b"),
        ("relative-json-pointer", "1/a", "-1/a"),
        ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000"),
    ],
)
def test_every_standard_format_is_checked(name, good, bad):
    assert check_format(name, good) and not check_format(name, bad)
    grammar = Grammar.from_json_schema({"type": "string", "format": name}, budget=OPEN)
    assert grammar.check(json.dumps(good)) and not grammar.check(json.dumps(bad))
    assert check_format("x-unknown", bad) and check_format(name, 3)  # annotations; non-strings


def test_walks_of_bad_input():
    grammar = Grammar.from_regex("ab")
    with pytest.raises(TypeError, match="text must be a str"):
        grammar.accepts_end(b"ab")
    assert grammar.accepts_end("ab") and not grammar.accepts_end("ab\ud800")
    lm = FunctionLM(["<s>", "a", "b", "</s>"], 3, lambda ctx: [0.0] * 4, bos_token_id=0)
    assert token_walk(grammar, lm, [1, 2]) == (True, True)
