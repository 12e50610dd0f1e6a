"""JSON Schemas on FunctionLM: relaxed tier + final check exact, compact whitespace, string budget, limits."""

from __future__ import annotations

import copy
import json
import math
import re

import numpy as np
import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from grammar_lms import assert_exact, brute_force, wavy_lm  # noqa: E402

from llamppl import run  # noqa: E402
from llamppl.decoding.grammar import engine as grammar_engine  # noqa: E402
from llamppl.decoding.grammar import json_budget as schema_budget  # noqa: E402
from llamppl.decoding.grammar.compile import Grammar, cap_sizes, json_grammar  # noqa: E402
from llamppl.decoding.grammar.engine import MatcherState, allowed_masks  # noqa: E402
from llamppl.decoding.grammar.json_budget import (  # noqa: E402
    FREE_VALUE,
    JSONBudget,
    bound_free_values,
    close_objects,
)
from llamppl.inference import enumerate_exact  # noqa: E402
from llamppl.models import GrammarConstraint, generate_json  # noqa: E402
from llamppl.models.structured import schema_prompt  # noqa: E402

DIGITS = ["<s>", "1", "3", "4", "7", "<eos>"]
STRING = ["<s>", '"', "a", "ab", "<eos>"]
BRACES = ["<s>", "{", "}", " ", "<eos>"]
# llguidance refuses both (oneOf; the unimplemented "not"); relaxed, they admit 3 and 4
RELAXED = {
    "oneOf": {"oneOf": [{"type": "integer", "maximum": 5}, {"type": "integer", "minimum": 3}]},
    "not": {"type": "integer", "not": {"enum": [3, 4]}},
}


def _valid(schema):
    def member(text):
        return bool(re.fullmatch(r"-?(0|[1-9][0-9]*)", text)) and jsonschema.Draft202012Validator(
            schema
        ).is_valid(json.loads(text))

    return member


def _consumes(lm, grammar, text_tokens):
    state = MatcherState(lm, grammar)
    return all(state.consume(lm.vocab.index(t)) for t in text_tokens) and state.accepting


@pytest.mark.parametrize("name", sorted(RELAXED))
def test_relaxed_schema_compiles_and_admits_invalid_texts(name):
    schema = RELAXED[name]
    with pytest.raises(ValueError, match="cannot express"):
        json_grammar(schema, relax=False)  # llguidance alone refuses it
    grammar = json_grammar(schema)
    assert grammar.relaxed and grammar.check is not None
    lm = wavy_lm(DIGITS)
    assert _consumes(lm, grammar, ["4"])  # the relaxed language admits an invalid text
    assert not grammar.check("4") and grammar.check("7")


@pytest.mark.parametrize("name", sorted(RELAXED))
@pytest.mark.parametrize("proposal", ["mask", "sample"])
def test_relaxed_grammar_with_final_check_is_exact(name, proposal):
    schema = RELAXED[name]
    log_z, post = brute_force(DIGITS, _valid(schema), max_tokens=3)
    assert "3" not in post and "4" not in post and len(post) >= 5
    model = GrammarConstraint(
        wavy_lm(DIGITS), [], json_schema=schema, proposal=proposal, max_tokens=3
    )
    assert_exact(model, log_z, post)


def test_every_returned_object_validates_and_failures_are_named():
    schema = RELAXED["oneOf"]
    out = generate_json(wavy_lm(DIGITS), [], schema, n_particles=64, seed=0, max_tokens=3)
    assert out.objects
    for obj, _ in out.objects:
        jsonschema.validate(obj, schema)
    assert all(cause == "budget" or cause.startswith("schema check") for cause in out.failures), (
        out.failures
    )


@pytest.mark.parametrize("limit", [1, 2])
def test_string_budget_is_part_of_the_target(limit):
    """Free strings get at most ``max_string_length`` characters; the posterior is exact for it."""

    def member(text):
        return bool(re.fullmatch(f'"[ab]{{0,{limit}}}"', text)) and "b" not in text[:2]

    log_z, post = brute_force(STRING, member, max_tokens=5)
    model = GrammarConstraint(
        wavy_lm(STRING),
        [],
        json_schema={"type": "string"},
        max_tokens=5,
        budget=JSONBudget(max_string_length=limit),
    )
    exact = run(enumerate_exact(model))
    assert exact.log_ml == pytest.approx(log_z, abs=1e-9)
    assert set(exact.posterior) == set(post)
    unbounded = GrammarConstraint(
        wavy_lm(STRING),
        [],
        json_schema={"type": "string"},
        max_tokens=5,
        budget=JSONBudget(max_string_length=None),
    )
    assert max(len(t) for t in run(enumerate_exact(unbounded)).posterior) > limit + 2


def test_size_budget_caps_only_free_strings_and_arrays():
    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}},
            "few": {"type": "array", "minItems": 20},
            "code": {"type": "string", "pattern": "^[a-z]+$"},
            "long": {"type": "string", "minLength": 100},
        },
    }
    capped = cap_sizes(schema, 64, 8)["properties"]
    assert capped["tags"] == {
        "type": "array",
        "items": {"type": "string", "maxLength": 64},
        "maxItems": 8,
    }
    assert capped["few"]["maxItems"] == 20 and capped["long"]["maxLength"] == 100
    assert capped["code"] == schema["properties"]["code"]
    assert cap_sizes(schema, None, None) == schema


def test_compact_whitespace_is_the_default():
    lm = wavy_lm(BRACES)
    space = BRACES.index(" ")
    for whitespace, allowed in (("compact", False), ("flexible", True)):
        budget = JSONBudget(whitespace=whitespace)
        model = GrammarConstraint(lm, [], json_schema={"type": "object"}, budget=budget)
        model.matcher.consume(BRACES.index("{"))
        assert bool(allowed_masks(lm, [model.matcher])[0, space]) is allowed
    default = GrammarConstraint(lm, [], json_schema={"type": "object"}, max_tokens=4)
    assert set(run(enumerate_exact(default)).posterior) == {"{}"}


def test_clones_share_one_mask_row(monkeypatch):
    """Particles in the same matcher state (clones) cost one llguidance row, same masks."""
    import llguidance.torch as llt

    lm = wavy_lm(DIGITS)
    grammar = Grammar.from_json_schema({"type": "integer"})
    a = MatcherState(lm, grammar)
    a.consume(1)
    b, c = copy.deepcopy(a), MatcherState(lm, grammar)
    singles = [allowed_masks(lm, [s])[0] for s in (a, b, c)]
    rows = []
    inner = llt.fill_next_token_bitmask_par
    monkeypatch.setattr(
        llt,
        "fill_next_token_bitmask_par",
        lambda ex, ms, bits: (rows.append(len(ms)), inner(ex, ms, bits)),
    )
    masks = allowed_masks(lm, [a, b, c, a])
    assert rows == [2]
    for i, s in enumerate([0, 1, 2, 0]):
        assert bool((masks[i] == singles[s]).all())
    assert grammar_engine.MatcherState is MatcherState


def test_json_grammars_are_cached_per_schema_and_options():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert json_grammar(schema) is json_grammar(json.loads(json.dumps(schema)))
    assert json_grammar(schema) is not json_grammar(
        schema, budget=JSONBudget(whitespace="flexible")
    )
    assert json_grammar(schema) is json_grammar(schema, budget=JSONBudget())  # None: the default


def test_schema_too_large_for_the_engine_is_refused_at_runtime_or_relaxed_at_compile():
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(3000)}}
    lm = wavy_lm(["<s>", "{", '"', "p", "1", ":", "}", "<eos>"])
    budget = JSONBudget(max_decimals=None)
    with pytest.raises(ValueError, match="exceeds the grammar engine's limits"):
        GrammarConstraint(lm, [], json_schema=schema, budget=budget)  # fails at token 1
    # At compile time "too big" is no refusal: the schema has instances ({} for one), so it
    # compiles to the skeleton tier and the exact jsonschema check keeps the answers valid.
    grammar = json_grammar(schema)
    assert any("too big" in reason for reason in grammar.relaxed)
    assert grammar.check('{"p1": 3}') and not grammar.check('{"p1": "x"}')


def test_bad_json_options_and_chat_without_template():
    with pytest.raises(ValueError, match="whitespace"):
        JSONBudget(whitespace="some")
    with pytest.raises(ValueError, match="max_string_length"):
        JSONBudget(max_string_length=0)
    with pytest.raises(TypeError, match="budget must be a JSONBudget or None, got dict"):
        json_grammar({"type": "string"}, budget={"max_string_length": 8})
    with pytest.raises(ValueError, match="chat template"):
        schema_prompt(wavy_lm(DIGITS), "", {"type": "integer"})
    with pytest.raises(TypeError, match="chat"):
        generate_json(wavy_lm(DIGITS), [], {"type": "integer"}, chat="yes")


KEYS = ["<s>", "{", "}", '"a":1', '"b":1', ",", "<eos>"]
LISTED = {"type": "object", "properties": {"a": {"type": "integer"}}}


# KEYS has no '"' token: after "{" of an open object llguidance forces '"' and its mask lists the
# tokens that may follow it, so a particle draws one, the engine rejects it and the particle dies
# with a RuntimeWarning (once per cause and process). Its weight is zero: the results stay exact.
@pytest.mark.filterwarnings("ignore:llguidance failed:RuntimeWarning")
@pytest.mark.parametrize("closed", [True, False])
def test_closed_objects_are_part_of_the_target(closed):
    """Closed objects (the default) keep only listed keys; the posterior is exact for it."""

    def member(text):
        try:
            obj = json.loads(text)
        except ValueError:
            return False
        listed = closed is False or set(obj) <= {"a"}
        return jsonschema.Draft202012Validator(LISTED).is_valid(obj) and listed

    log_z, post = brute_force(KEYS, member, max_tokens=5)
    assert ('{"b":1}' in post) is not closed
    lm = wavy_lm(KEYS)
    budget = JSONBudget(closed_objects=closed)
    model = GrammarConstraint(lm, [], json_schema=LISTED, max_tokens=5, budget=budget)
    assert_exact(model, log_z, post)


def test_close_objects_leaves_conjoined_and_explicit_objects_open():
    obj = {"type": "object", "properties": {"x": {"type": "string"}}}
    assert close_objects(obj, 64)["additionalProperties"] is False
    for open_ in (
        {**obj, "additionalProperties": True},  # the schema says so
        {**obj, "required": ["y"]},  # asks for an unlisted key
        {**obj, "minProperties": 2},
        {**obj, "anyOf": [{"required": ["x"]}]},  # combinator beside the keywords
        {**obj, "$ref": "#/definitions/d", "definitions": {"d": {}}},
    ):
        assert "additionalProperties" not in close_objects(open_, 64) or open_.get(
            "additionalProperties"
        ), open_
    conj = close_objects({"allOf": [obj, {"properties": {"y": {}}}]}, 64)
    assert all("additionalProperties" not in branch for branch in conj["allOf"])
    union = close_objects({"anyOf": [obj, {"type": "integer"}]}, 64)  # alternatives: closed
    assert union["anyOf"][0]["additionalProperties"] is False
    shared = {
        "definitions": {"d": obj, "e": obj},
        "properties": {"p": {"allOf": [{"$ref": "#/definitions/d"}, {"required": ["z"]}]}},
        "items": {"$ref": "#/definitions/e"},
    }
    out = close_objects(shared, 64)["definitions"]
    assert "additionalProperties" not in out["d"] and out["e"]["additionalProperties"] is False


def test_maps_get_short_keys_and_closed_grammars_compile_or_fall_back(monkeypatch):
    out = close_objects({"type": "object", "additionalProperties": {"type": "integer"}}, 5)
    assert out["patternProperties"] == {"^.{0,5}$": {"type": "integer"}}
    assert out["additionalProperties"] is False
    grammar = json_grammar(LISTED)
    lm = wavy_lm(KEYS)
    assert _consumes(lm, grammar, ["{", '"a":1', "}"])
    assert not _consumes(lm, grammar, ["{", '"b":1', "}"])
    open_budget = JSONBudget(closed_objects=False)
    assert _consumes(lm, json_grammar(LISTED, budget=open_budget), ["{", '"b":1', "}"])
    # a closed schema the engine cannot satisfy falls back to the open budget
    monkeypatch.setattr(
        schema_budget,
        "budget_schema",
        lambda s, n, m, closed=True, d=None: {"not": {}} if closed else s,
    )
    schema = {"type": "object", "properties": {"c": {"type": "integer"}}}
    assert _consumes(lm, json_grammar(schema), ["{", "}"])
    with pytest.raises(TypeError, match="closed_objects must be a bool"):
        JSONBudget(closed_objects=1)


NUMBERS = ["<s>", "1", "2", ".", "<eos>"]


@pytest.mark.parametrize("decimals", [1, None])
def test_number_budget_is_part_of_the_target(decimals):
    """Free numbers get at most ``max_decimals`` decimals; the posterior is exact for it."""

    def member(text):
        frac = r"(\.[12]{1,%s})?" % ("" if decimals is None else decimals)
        return bool(re.fullmatch(r"[12][12]*" + frac, text))

    log_z, post = brute_force(NUMBERS, member, max_tokens=5)
    assert ("1.12" in post) is (decimals is None)
    model = GrammarConstraint(
        wavy_lm(NUMBERS),
        [],
        json_schema={"type": "number"},
        max_tokens=5,
        budget=JSONBudget(max_decimals=decimals),
    )
    assert_exact(model, log_z, post)


def test_number_budget_bounds_only_free_sides():
    capped = cap_sizes(
        {
            "properties": {
                "x": {"type": "number"},
                "n": {"type": "integer", "minimum": 0},
                "m": {"type": "number", "multipleOf": 0.5, "exclusiveMaximum": 3},
                "e": {"type": "number", "enum": [1.25]},
            }
        },
        None,
        None,
        max_decimals=6,
    )["properties"]
    big = 10**15 - 1
    assert capped["x"] == {"type": "number", "multipleOf": 1e-6, "maximum": big, "minimum": -big}
    assert capped["n"] == {"type": "integer", "minimum": 0, "maximum": big}
    assert capped["m"] == {
        "type": "number",
        "multipleOf": 0.5,
        "exclusiveMaximum": 3,
        "minimum": -big,
    }
    assert capped["e"] == {"type": "number", "enum": [1.25]}


FREE = ["<s>", "[", "]", "1", ",", "<eos>"]


def test_free_values_are_scalars_or_flat_containers():
    schema = {"type": "array", "items": {}}
    assert bound_free_values(schema)["items"] == FREE_VALUE
    assert bound_free_values({"properties": {"v": True}})["properties"]["v"] == FREE_VALUE
    assert bound_free_values({"type": "array", "items": {"type": "integer"}})["items"] == {
        "type": "integer"
    }
    lm = wavy_lm(FREE)
    budgeted = json_grammar(schema)
    open_ = json_grammar(schema, budget=JSONBudget(closed_objects=False))
    for text, ok in ((["[", "1", ",", "1", "]"], True), (["[", "[", "1", "]", "]"], True)):
        assert _consumes(lm, budgeted, text) is ok
    nested = ["[", "[", "[", "1", "]", "]", "]"]  # an array in an array in the free value
    assert not _consumes(lm, budgeted, nested) and _consumes(lm, open_, nested)


def test_generate_json_default_is_importance_sampling_and_unbiased():
    """Mask proposal: no resampling by default (independent exact draws); mean Ẑ within 4 SE."""
    schema = RELAXED["oneOf"]
    lm = wavy_lm(DIGITS)
    exact = run(enumerate_exact(GrammarConstraint(lm, [], json_schema=schema, max_tokens=3)))
    out = generate_json(lm, [], schema, n_particles=4, seed=0, max_tokens=3)
    assert out.result.algorithm == "importance_sampling"
    assert not any(step.resampled for step in out.result.history)
    smc = generate_json(lm, [], schema, n_particles=4, seed=0, max_tokens=3, ess_threshold=0.5)
    sample = generate_json(lm, [], schema, n_particles=4, seed=0, max_tokens=3, proposal="sample")
    assert smc.result.algorithm == sample.result.algorithm == "smc_standard"
    z = np.array(
        [
            math.exp(generate_json(lm, [], schema, n_particles=4, seed=s, max_tokens=3).log_ml)
            for s in range(200)
        ]
    )
    se = z.std(ddof=1) / math.sqrt(len(z))
    assert abs(z.mean() - math.exp(exact.log_ml)) < 4 * se


def test_a_python_predicate_on_the_values_composes_with_the_schema():
    """``generate_json(..., predicate=...)`` is the schema's grammar & a Python check: exact."""
    vocab = ["<s>", "{", "}", '"a":', "1", "2", "7", "<eos>"]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    no_seven = lambda text: "7" not in text  # noqa: E731 - a user's check on the value

    def valid(text):
        try:
            return jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
        except json.JSONDecodeError:
            return False

    log_z, post = brute_force(vocab, lambda t: valid(t) and no_seven(t), 6)
    model = GrammarConstraint(
        wavy_lm(vocab), [], json_schema=schema, predicate=no_seven, max_tokens=6
    )
    assert model.proposal == "lazy"
    assert_exact(model, log_z, post)
    out = generate_json(wavy_lm(vocab), [], schema, 8, seed=0, max_tokens=6, predicate=no_seven)
    assert out.objects and all("7" not in str(obj["a"]) for obj, _ in out.objects)
