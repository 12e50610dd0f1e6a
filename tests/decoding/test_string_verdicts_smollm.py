"""String verdicts against the token walk on SmolLM2's real vocabulary (49,152 BPE tokens).

A grammar's and a conjunction of text constraints' ``accepts_prefix`` / ``accepts_end``
equal their walk of the tokenizer's own spelling of each text and of a second spelling made
of separately encoded pieces (not canonical); ``canonical`` accepts a text's own spelling
exactly when ``accepts_end`` says so and refuses the pieced one.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("llguidance")

from string_walks import random_texts, token_walk  # noqa: E402

from llamppl.constraints import Grammar, canonical  # noqa: E402

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "pop": {"type": "integer"}},
    "required": ["city"],
}


def _pieced(lm, text: str, rng: random.Random) -> list[int]:
    """``text`` cut at random places, each piece encoded alone: a spelling, rarely canonical."""
    cuts = sorted(rng.sample(range(1, len(text)), min(3, len(text) - 1))) if len(text) > 1 else []
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    return [t for piece in pieces for t in lm.encode(piece)]


@pytest.mark.parametrize(
    ("grammar", "seeds"),
    [
        (
            lambda: Grammar.from_json_schema(SCHEMA),
            ['{"city":"Paris","pop":2100000}', '{"city":"Rome"}'],
        ),
        (
            lambda: Grammar.from_regex(r"(Mon|Tues)day, [0-9]{1,2} (May|June)"),
            ["Monday, 12 May", "Tuesday, 3 June"],
        ),
    ],
)
def test_grammar_verdicts_on_the_real_vocabulary(smollm, grammar, seeds):
    grammar, rng = grammar(), random.Random(11)
    texts = random_texts(seeds, rng, 40)
    verdicts = set()
    for text in texts:
        verdict = (grammar.accepts_prefix(text), grammar.accepts_end(text))
        assert token_walk(grammar, smollm, smollm.encode(text)) == verdict, text
        assert token_walk(grammar, smollm, _pieced(smollm, text, rng)) == verdict, text
        verdicts.add(verdict)
    assert verdicts == {(True, True), (True, False), (False, False)}


def test_text_constraint_verdicts_on_the_real_vocabulary(smollm):
    from text_programs import use_shared_nltk_data

    from llamppl.constraints import banned_words, max_word_length, word_count

    pytest.importorskip("nltk")
    use_shared_nltk_data()
    c = max_word_length(6) & banned_words(["storm"]) & word_count(at_most=7)
    rng = random.Random(2)
    seeds = ["The calm sea rolled in.", "A storm came at night.", "Birds flew over the bay."]
    verdicts = set()
    for text in random_texts(seeds, rng, 40, extra=" ."):
        verdict = (c.accepts_prefix(text), c.accepts_end(text))
        assert token_walk(c, smollm, smollm.encode(text)) == verdict, text
        assert token_walk(c, smollm, _pieced(smollm, text, rng)) == verdict, text
        verdicts.add(verdict)
    assert (True, True) in verdicts and (False, False) in verdicts


def test_canonical_on_the_real_vocabulary(smollm):
    prompt = smollm.encode("The capital of France is")
    c = canonical(after=prompt, lm=smollm)
    rng = random.Random(5)
    refused = 0
    for text in [" Paris.", " Paris, of course", " a city", " Lyon? No, Paris"]:
        own = smollm.encode(text)
        assert token_walk(c, smollm, own) == (c.accepts_prefix(text), c.accepts_end(text))
        assert c.accepts_end(text)
        pieced = _pieced(smollm, text, rng)
        if pieced != own:
            assert token_walk(c, smollm, pieced)[1] is False
            refused += 1
    assert refused >= 2
    assert not canonical(after=smollm.encode(" Par"), lm=smollm).accepts_prefix("is")  # " Paris"
