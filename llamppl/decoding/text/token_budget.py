"""How many tokens to give a text constraint: ``max_tokens`` read from its counts and targets.

:class:`~llamppl.models.HardConstraint` cuts a text after ``max_tokens`` tokens; too few
and no particle can meet a count, too many and a particle may wander for hundreds of tokens
before a dead end shows. :func:`token_budget` reads the room a text constraint needs from
its own parts (never from a prompt)::

    from llamppl.constraints import token_budget, word_count, words_at
    c = word_count(exactly=8) & words_at({-1: "ocean"})
    model = HardConstraint(lm, prompt, c, max_tokens=token_budget(lm, c))   # 28

The rates are SmolLM2's plain English (:data:`TOKENS_PER_WORD`) with room to spare, and
serve the COLLIE benchmark (``benchmarks/bench_collie.py``) as they are.
"""

from __future__ import annotations

from llamppl.decoding.constraints.protocol import AllOf, Constraint
from llamppl.decoding.text.counts import CharCount, EachCount, UnitCount
from llamppl.decoding.text.positions import EachAt
from llamppl.decoding.text.presence import WordsIncluded
from llamppl.lm.base import LanguageModel

__all__ = ["TOKENS_PER_WORD", "WORDS_PER_SENTENCE", "MIN_TOKENS", "MAX_TOKENS", "token_budget"]

TOKENS_PER_WORD = 1.4
"""Tokens per judge word of plain English, punctuation included, with room (SmolLM2)."""
WORDS_PER_SENTENCE = 18
"""Room per free sentence when nothing bounds its length."""
MIN_TOKENS = 24
MAX_TOKENS = 400


def token_budget(lm: LanguageModel, constraint: Constraint) -> int:
    """``max_tokens`` for ``constraint``, derived from its counts and targets.

    Room for what the constraint asks: characters (half a token each, plus 12), words (2
    tokens each, plus 12; a floor alone: 8 more words), required words (their own tokens and
    a free sentence, plus 12), sentences (so many words each: the upper bound of
    ``words_per_sentence``, else 5/4 of its lower bound plus 4, else
    :data:`WORDS_PER_SENTENCE`; :data:`TOKENS_PER_WORD` tokens per word, plus 16), the target
    sentences of paragraphs (their own tokens, ``min_sentences - 1`` free sentences each, 8
    tokens per paragraph, plus 16); at least :data:`MIN_TOKENS` and at most
    :data:`MAX_TOKENS`. The parts the constraint's conjunction was given are read (what they
    imply together adds no room); other constraints add none.

    Raises
    ------
    TypeError
        If ``constraint`` is not a :class:`~llamppl.decoding.constraints.protocol.Constraint`.
    """
    if not isinstance(constraint, Constraint):
        raise TypeError(f"constraint must be a Constraint, got {type(constraint).__name__}")
    parts = constraint.given if isinstance(constraint, AllOf) else (constraint,)
    need, sentences, words_each = MIN_TOKENS, None, None
    for p in parts:
        if isinstance(p, CharCount):
            n = p.bounds.hi if p.bounds.hi is not None else p.bounds.lo
            need = max(need, n // 2 + 12)
        elif isinstance(p, UnitCount) and p.level == "word":
            n = p.bounds.hi if p.bounds.hi is not None else p.bounds.lo + 8
            need = max(need, 2 * n + 12)
        elif isinstance(p, UnitCount) and p.level == "sentence":
            sentences = p.bounds.hi if p.bounds.hi is not None else p.bounds.lo
        elif isinstance(p, EachCount) and (p.outer, p.inner) == ("sentence", "word"):
            words_each = p.bounds.hi if p.bounds.hi is not None else p.bounds.lo * 5 // 4 + 4
        elif isinstance(p, EachAt) and not isinstance(p.targets, str):
            if p.outer == "sentence":
                sentences = len(p.targets)
            else:
                own = sum(len(lm.encode(t)) + 2 for t in p.targets)
                free = max(1, p.min_inner - 1) * len(p.targets)
                room = int(free * WORDS_PER_SENTENCE * TOKENS_PER_WORD) + 8 * len(p.targets)
                need = max(need, own + room + 16)
        elif isinstance(p, WordsIncluded):  # a sentence around the required words
            own = sum(len(lm.encode(" " + w)) for w in p.words)
            need = max(need, own + int(WORDS_PER_SENTENCE * TOKENS_PER_WORD) + 12)
    if sentences is not None:
        per = words_each if words_each is not None else WORDS_PER_SENTENCE
        need = max(need, int(sentences * per * TOKENS_PER_WORD) + 16)
    return min(MAX_TOKENS, need)
