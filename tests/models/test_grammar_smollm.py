"""Grammar constraints on the embedded SmolLM2: every returned particle is valid (JSON Schema, regex, Lark)."""

from __future__ import annotations

import ast
import json
import math
import re

import pytest
import torch

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from llamppl import run  # noqa: E402
from llamppl.inference import smc_standard  # noqa: E402
from llamppl.models import GrammarConstraint, GrammarLogitsProcessor, generate_json  # noqa: E402

pytestmark = pytest.mark.slow

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
ARITHMETIC = r"""
start: expr
expr: term (("+" | "-") term)*
term: NUMBER | "(" expr ")"
NUMBER: /[1-9][0-9]{0,2}|0/
"""


def _chat(lm, text):
    messages = [{"role": "user", "content": text}]
    return lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _live(result):
    return [p for p, w in zip(result.particles, result.log_weights) if w > -math.inf]


def test_generate_json_every_particle_validates(smollm):
    prompt = _chat(
        smollm, "Give the person as JSON with name and age: 'Maria Lopez, 34, is a nurse.'"
    )
    out = generate_json(smollm, prompt, PERSON, n_particles=4, seed=0, max_tokens=32)
    assert out.log_ml > -math.inf and out.log_ml <= 0
    live = _live(out.result)
    assert live
    for particle in live:
        assert particle.finished
        jsonschema.validate(json.loads(particle.text), PERSON)
    assert sum(w for _, w in out.objects) == pytest.approx(1.0)
    for obj, _ in out.objects:
        jsonschema.validate(obj, PERSON)


def test_generate_json_with_a_pydantic_model(smollm):
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):
        name: str
        age: int

    prompt = _chat(smollm, "Give the person as JSON with name and age: 'Tom Hill is 52.'")
    out = generate_json(smollm, prompt, Person, n_particles=3, seed=1, max_tokens=32)
    assert out.objects and all(isinstance(o, Person) for o, _ in out.objects)


@pytest.mark.parametrize("proposal", ["mask", "sample"])
def test_regex_particles_match(smollm, proposal):
    pattern = r"[0-9]{1,2}:[0-9]{2} (am|pm)"
    model = GrammarConstraint(
        smollm,
        _chat(smollm, "What time is lunch?"),
        regex=pattern,
        proposal=proposal,
        max_tokens=10,
    )
    result = run(smc_standard(model, 4, seed=0))
    live = _live(result)
    if proposal == "mask":  # masking cannot lose a particle before the budget
        assert live
    for particle in live:
        assert re.fullmatch(pattern, particle.text), particle.text


def _is_arithmetic(text):
    """Independent check: a Python expression of +, - and parentheses over integer literals."""
    if not re.fullmatch(r"[0-9+\-()]+", text):
        return False
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    allowed = (ast.Expression, ast.BinOp, ast.Add, ast.Sub, ast.Constant)
    return all(isinstance(n, allowed) for n in ast.walk(tree)) and "--" not in text


def test_lark_arithmetic_particles_parse(smollm):
    model = GrammarConstraint(
        smollm, _chat(smollm, "Write a sum of three numbers."), lark=ARITHMETIC, max_tokens=12
    )
    result = run(smc_standard(model, 4, seed=0))
    live = _live(result)
    assert live
    for particle in live:
        assert _is_arithmetic(particle.text), particle.text


def test_logits_processor_with_hf_generate(smollm):
    prompt = _chat(smollm, "Give the person as JSON with name and age: 'Ann Lee, 29.'")
    ids = smollm.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    ids = ids.repeat(3, 1)
    proc = GrammarLogitsProcessor(smollm, json_schema=PERSON)
    torch.manual_seed(0)
    out = smollm.model.generate(
        ids,
        attention_mask=ids.new_ones(ids.shape),
        logits_processor=[proc],
        do_sample=True,
        top_k=0,
        top_p=1.0,
        max_new_tokens=40,
        eos_token_id=smollm.eos_token_id,
        pad_token_id=smollm.eos_token_id,
    )
    for row in out[:, ids.shape[1] :].tolist():
        assert smollm.eos_token_id in row  # finished within the budget (fixed seed)
        row = row[: row.index(smollm.eos_token_id)]
        jsonschema.validate(json.loads(smollm.decode(row)), PERSON)


def test_forced_token_agrees_with_the_full_mask_on_real_json(smollm):
    """Along random walks through a real schema, ``forced_token`` is the mask's one non-EOS
    token exactly when the mask is a singleton (byte-level vocabulary: no singleton missed)."""
    from llamppl.decoding.grammar.engine import Grammar, MatcherState, allowed_masks, forced_token

    grammar = Grammar.from_json_schema(PERSON)
    rng = torch.Generator().manual_seed(0)
    checked = singletons = 0
    for _ in range(6):
        state = MatcherState(smollm, grammar)
        for _ in range(40):
            mask = allowed_masks(smollm, [state])[0]
            ids = torch.nonzero(mask).flatten()
            alone = int(ids[0]) if ids.numel() == 1 and int(ids[0]) != smollm.eos_token_id else None
            assert forced_token(state) == alone
            checked, singletons = checked + 1, singletons + (alone is not None)
            choices = ids[ids != smollm.eos_token_id]
            if choices.numel() == 0:
                break
            pick = int(choices[torch.randint(choices.numel(), (1,), generator=rng)])
            assert state.consume(pick)
    assert checked >= 60 and singletons >= 5, (checked, singletons)
