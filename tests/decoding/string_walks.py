"""Random texts, random spellings and the token-level walk: what the string-verdict tests share.

- :func:`random_texts` — seeded texts near a constraint's language: the seed texts, their
  prefixes, one-character edits of them, and random strings over their alphabet;
- :func:`chunk_lm` — a :class:`~llamppl.FunctionLM` whose vocabulary is every character of
  the texts and random 2-4 character pieces of the seeds, so one text has many spellings;
- :func:`spell` — a random spelling of a text in that vocabulary (any token that fits next);
- :func:`token_walk` — the walk of a token string through a constraint: ``start``, then
  ``allows`` / ``advance`` per token, then ``ends``: ``(prefix, end)`` verdicts;
- :func:`assert_agree` — on every text, ``accepts_prefix`` / ``accepts_end`` equal the
  walk of several random spellings.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from llamppl import FunctionLM
from llamppl.decoding.constraints.protocol import Constraint


def random_texts(seeds: Sequence[str], rng: random.Random, n: int, extra: str = "") -> list[str]:
    """``n`` texts near ``seeds``: the seeds, prefixes, one-character edits (over the seeds'
    characters and ``extra``) and random strings."""
    alphabet = sorted(set("".join(seeds)) | set(extra))
    out = list(seeds)
    while len(out) < n:
        seed = rng.choice(seeds)
        kind = rng.random()
        if kind < 0.3:
            out.append(seed[: rng.randrange(len(seed) + 1)])
        elif kind < 0.8 and seed:
            i = rng.randrange(len(seed))
            edit = rng.choice(("insert", "delete", "replace"))
            char = rng.choice(alphabet)
            if edit == "insert":
                out.append(seed[:i] + char + seed[i:])
            elif edit == "delete":
                out.append(seed[:i] + seed[i + 1 :])
            else:
                out.append(seed[:i] + char + seed[i + 1 :])
        else:
            out.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 12))))
    return out


def chunk_lm(texts: Sequence[str], rng: random.Random, pieces: int = 40) -> FunctionLM:
    """A FunctionLM over every character of ``texts`` and ``pieces`` random 2-4 character
    pieces of them (BOS first, EOS last)."""
    chars = sorted(set("".join(texts)))
    chunks: set[str] = set()
    long = [t for t in texts if len(t) >= 2]
    for _ in range(pieces if long else 0):
        t = rng.choice(long)
        i = rng.randrange(len(t) - 1)
        chunks.add(t[i : i + rng.randint(2, 4)])
    vocab = ["<s>", *chars, *sorted(chunks - set(chars)), "</s>"]
    return FunctionLM(vocab, len(vocab) - 1, lambda ctx: [0.0] * len(vocab), bos_token_id=0)


def spell(lm: FunctionLM, text: str, rng: random.Random) -> list[int]:
    """A random spelling of ``text`` in ``lm``'s vocabulary (every character is a token)."""
    by_first: dict[str, list[int]] = {}
    for i, t in enumerate(lm.vocab[1:-1], start=1):
        by_first.setdefault(t[0], []).append(i)
    ids, pos = [], 0
    while pos < len(text):
        fits = [i for i in by_first[text[pos]] if text.startswith(lm.vocab[i], pos)]
        token = rng.choice(fits)
        ids.append(token)
        pos += len(lm.vocab[token])
    return ids


def token_walk(c: Constraint, lm, tokens: Sequence[int]) -> tuple[bool, bool]:
    """``(prefix, end)``: whether ``c`` allows every token of ``tokens`` in turn, and whether
    it then lets the text end (False when a token was refused)."""
    state = c.start(lm)
    for token in tokens:
        if not c.allows(lm, state, token):
            return False, False
        state = c.advance(lm, state, token)
    return True, bool(c.ends(lm, state))


def assert_agree(
    c: Constraint, texts: Sequence[str], lm, rng: random.Random, spellings: int = 2
) -> tuple[int, int]:
    """On every text, ``c.accepts_prefix`` and ``c.accepts_end`` equal the walk of
    ``spellings`` random spellings; returns (texts accepted as prefixes, as ends), so a
    caller can check that both verdicts occur."""
    prefixes = ends = 0
    for text in texts:
        verdict = (c.accepts_prefix(text), c.accepts_end(text))
        for _ in range(spellings):
            walked = token_walk(c, lm, spell(lm, text, rng))
            assert walked == verdict, (text, walked, verdict)
        prefixes += verdict[0]
        ends += verdict[1]
    return prefixes, ends
