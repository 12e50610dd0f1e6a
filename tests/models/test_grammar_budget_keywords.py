"""The JSON budget's earlier spellings: five keywords, served by the compatibility table.

Our signatures take the budget as one value, ``budget=JSONBudget(...)`` (None: the default).
The keywords ``whitespace=``, ``max_string_length=``, ``max_array_items=``,
``closed_objects=`` and ``max_decimals=`` that ``json_grammar``, ``Grammar.from_json_schema``,
``make_grammar``, ``GrammarConstraint`` and ``generate_json`` took before are rows of
``llamppl.compat.table`` (``budget_keywords``): each gives exactly what ``budget=`` gives, and
the old reconciling rules hold (a keyword at its default counts as not given; a budget and
a changed keyword together are a ``ValueError``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("llguidance")

from grammar_lms import wavy_lm  # noqa: E402

from llamppl.compat.adapters import BUDGET_KEYWORDS  # noqa: E402
from llamppl.decoding.grammar.compile import Grammar, json_grammar  # noqa: E402
from llamppl.decoding.grammar.engine import make_grammar  # noqa: E402
from llamppl.decoding.grammar.json_budget import DEFAULT_BUDGET, JSONBudget  # noqa: E402
from llamppl.models import GrammarConstraint, generate_json  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {"s": {"type": "string"}, "n": {"type": "number"}, "a": {"type": "array"}},
}
CHANGES = [
    ("whitespace", "flexible"),
    ("max_string_length", 8),
    ("max_string_length", None),
    ("max_array_items", 2),
    ("closed_objects", False),
    ("max_decimals", None),
]
DIGITS = ["<s>", "1", "3", "4", "<eos>"]


def test_the_old_keywords_are_the_budgets_fields():
    # key_order came with JSONBudget: it is given through budget= only, never as a keyword
    assert set(BUDGET_KEYWORDS) == set(JSONBudget.__dataclass_fields__) - {"key_order"}
    assert DEFAULT_BUDGET == JSONBudget()


@pytest.mark.parametrize(("keyword", "value"), CHANGES)
def test_each_keyword_gives_what_budget_gives(keyword, value):
    budget = JSONBudget(**{keyword: value})
    grammar = json_grammar(SCHEMA, budget=budget)
    assert grammar is not json_grammar(SCHEMA)  # the setting matters
    assert json_grammar(SCHEMA, **{keyword: value}) is grammar  # one cache key
    assert Grammar.from_json_schema(SCHEMA, **{keyword: value}) is grammar
    assert make_grammar(json_schema=SCHEMA, **{keyword: value}) is grammar
    lm = wavy_lm(["<s>", "{", "}", '"s":', '"a"', "1", "<eos>"])
    old = GrammarConstraint(lm, [], json_schema=SCHEMA, max_tokens=5, **{keyword: value})
    assert old.grammar is grammar


def test_generate_json_takes_the_keywords_beside_its_run_options():
    lm = wavy_lm(DIGITS)
    new = generate_json(
        lm, [], {"type": "number"}, 4, seed=0, max_tokens=4, budget=JSONBudget(max_decimals=1)
    )
    old = generate_json(lm, [], {"type": "number"}, 4, seed=0, max_tokens=4, max_decimals=1)
    assert old.texts == new.texts and old.log_ml == new.log_ml
    with pytest.raises(TypeError, match=r"generate_json\(\) got unexpected keyword"):
        generate_json(lm, [], {"type": "number"}, 4, max_decimals=1, colour="red")


def test_the_old_reconciling_rules_hold():
    budget = JSONBudget(max_string_length=8)
    # a keyword left at its default beside a budget counts as not given
    assert json_grammar(SCHEMA, budget=budget, whitespace="compact") is json_grammar(
        SCHEMA, budget=budget
    )
    with pytest.raises(ValueError, match=r"give budget= or the keywords \['max_array_items'\]"):
        json_grammar(SCHEMA, budget=budget, max_array_items=2)
    with pytest.raises(TypeError, match="budget must be a JSONBudget"):
        make_grammar(json_schema=SCHEMA, budget="compact", max_array_items=2)
    # the keywords' own checks are the budget's
    with pytest.raises(ValueError, match="whitespace must be one of"):
        json_grammar(SCHEMA, whitespace="some")
    with pytest.raises(ValueError, match="max_string_length must be a positive integer"):
        Grammar.from_json_schema(SCHEMA, max_string_length=0)
    with pytest.raises(TypeError, match="closed_objects must be a bool"):
        GrammarConstraint(wavy_lm(DIGITS), [], json_schema=SCHEMA, closed_objects=1)


def test_the_old_json_budget_helper_is_a_row_too():
    from llamppl.decoding.grammar import json_budget as module

    assert module.json_budget() == DEFAULT_BUDGET
    assert module.json_budget(None, max_array_items=2) == JSONBudget(max_array_items=2)
    budget = JSONBudget(whitespace="flexible")
    assert module.json_budget(budget, max_decimals=6) is budget  # 6 is the default
    with pytest.raises(ValueError, match="not both"):
        module.json_budget(budget, max_decimals=2)
    with pytest.raises(TypeError, match="unexpected keyword"):
        module.json_budget(None, colour="red")
    assert "json_budget" in module.__all__
