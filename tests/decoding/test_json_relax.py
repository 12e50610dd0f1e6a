"""Schemas llguidance refuses compile to a superset grammar, and the program stays exact.

Each refused kind (a lookaround or backreference ``pattern``, ``patternProperties`` with
one, sibling keys of a circular ``$ref``) must compile; ``GrammarConstraint`` on it must
give exactly the brute-force conditional of the LM given jsonschema validity; dropped
patterns come back as a prefix check on their strings; unsatisfiable and unresolvable
schemas are still refused with llguidance's words.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("llguidance", reason="needs llguidance (dev extra)")
jsonschema = pytest.importorskip("jsonschema")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "models"))
from grammar_lms import assert_exact, brute_force, wavy_lm  # noqa: E402

from llamppl.decoding.grammar_compile import json_grammar  # noqa: E402
from llamppl.decoding.json_patterns import JSONStringPatterns, string_values  # noqa: E402
from llamppl.decoding.json_relax import WILDCARD, strip_unsupported  # noqa: E402
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
        (("a", WILDCARD), 'x"y', True),
        (("a", WILDCARD, "b"), "z", False),
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
    assert dropped == [(("bad", WILDCARD), "^(a)\\1")]


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
