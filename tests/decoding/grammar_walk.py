"""Walking a compiled grammar over a text, one character per token: the acceptance test
the JSON Schema tiers' tests share."""

from __future__ import annotations

from llamppl import FunctionLM
from llamppl.decoding.grammar.compile import Grammar


def walk(grammar: Grammar, text: str) -> int | bool:
    """Feed ``text`` one character per token through ``grammar`` and its prefix check (the
    constraint ``GrammarConstraint`` enforces): the index of the first character refused,
    else whether the text may end there (the engine accepts, the prefix check's and the
    ``jsonschema`` complete checks pass)."""
    checks = grammar if grammar.prefix_checks is None else grammar & grammar.prefix_checks
    vocab = ["<s>", *sorted(set(text)), "<eos>"]
    lm = FunctionLM(vocab, len(vocab) - 1, lambda ctx: [0.0] * len(vocab), bos_token_id=0)
    state = checks.start(lm)
    for i, char in enumerate(text):
        token = vocab.index(char)
        if not checks.allows(lm, state, token):
            return i
        state = checks.advance(lm, state, token)
    return checks.ends(lm, state)
