"""Real JSONSchemaBench schemas on the embedded SmolLM2 (small budgets): outputs validate, refusals.

The schemas in ``tests/data/jsonschemabench/`` are copied from JSONSchemaBench
(guidance-ai/jsonschemabench, commit ba103c73; see the README there).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from llamppl.decoding.grammar.compile import json_grammar  # noqa: E402
from llamppl.decoding.grammar.json_budget import JSONBudget  # noqa: E402
from llamppl.models import GrammarConstraint, generate_json  # noqa: E402
from llamppl.models.structured import SCHEMA_INSTRUCTION, schema_prompt  # noqa: E402

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[1] / "data" / "jsonschemabench"
FILES = sorted(p.name for p in DATA.glob("*.json"))


def _validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _free_whitespace(text: str) -> bool:
    """Whitespace outside JSON strings."""
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (not escaped and ch == "\\"), in_string and (escaped or ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in " \t\n\r":
            return True
    return False


def test_the_copied_schemas_are_there():
    assert len(FILES) == 4


@pytest.mark.parametrize("name", FILES)
def test_real_schema_every_returned_object_validates(smollm, name):
    schema = json.loads((DATA / name).read_text())
    out = generate_json(smollm, "", schema, n_particles=2, seed=0, max_tokens=48, chat=True)
    assert out.objects or out.failures  # no output comes with its causes
    validator = _validator(schema)
    for obj, _ in out.objects:
        assert validator.is_valid(obj), (name, obj)
    for text, _ in out.texts:
        assert not _free_whitespace(text), text  # compact by default
    assert math.isfinite(out.log_ml) == bool(out.objects)


def test_relaxed_real_schema_compiles():
    schema = json.loads((DATA / "o26951.json").read_text())  # oneOf: llguidance alone refuses
    with pytest.raises(ValueError, match="oneOf"):
        json_grammar(schema, relax=False)
    assert json_grammar(schema).relaxed


def test_chat_prompt_carries_instruction_and_schema(smollm):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    prompt = schema_prompt(smollm, "Give a.", schema)
    assert SCHEMA_INSTRUCTION in prompt and json.dumps(schema) in prompt and "Give a." in prompt


def test_grammar_with_no_finite_string_is_refused_at_construction(smollm):
    with pytest.raises(ValueError, match="exceeds the grammar engine's limits.*no finite string"):
        GrammarConstraint(smollm, "x", lark='start: a\na: "x" a', max_tokens=40)


def test_schema_with_3000_optional_properties_is_refused_or_relaxed(smollm):
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(3000)}}
    budget = JSONBudget(max_decimals=None)
    with pytest.raises(  # compiles, but the engine gives up at the first token
        ValueError, match="exceeds the grammar engine's limits.*optional properties"
    ):
        GrammarConstraint(smollm, "x", json_schema=schema, max_tokens=40, budget=budget)
    relaxed = GrammarConstraint(smollm, "x", json_schema=schema, max_tokens=40)  # compile: skeleton
    assert any("too big" in reason for reason in relaxed.grammar.relaxed)
