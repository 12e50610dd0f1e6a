"""ByteLM on the embedded SmolLM2: prompts that end inside a word are healed, the coverings of
concurrent requests share forwards, and the canonical pair test passes canonical encodings."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from llamppl import ByteLM, run
from llamppl.lm.bytes import document_start
from llamppl.lm.bytes.canonical import canonical_pair, is_canonical

pytestmark = pytest.mark.slow

PROMPTS = [("Two plus two equals fo", "ur"), ("The moon orbits the Ear", "th")]


def test_greedy_heals_a_prompt_that_ends_inside_a_word(make_lm):
    lm = make_lm()
    byte_lm = ByteLM(lm, beam=8)
    assert byte_lm.context == document_start(lm) == (0,)  # <|endoftext|>: no BOS
    for prompt, want in PROMPTS:
        got = run(byte_lm.greedy(prompt, max_bytes=len(want) + 1))
        assert re.match(r"[a-z]*", got).group() == want, (prompt, got)
        # the token view continues after " fo" / " Ear" as a new token
        ids = list(document_start(lm)) + lm.encode(prompt)
        first = int(run(lm.next_token_logprobs(ids)).argmax())
        assert not lm.decode([first]).startswith(want)


def test_concurrent_coverings_share_forwards(make_lm):
    prompts = [b"The cat sat", b"A dog ran", b"Rain fell", b"We walked"]

    def forwards(concurrent: bool) -> int:
        lm = make_lm()
        byte_lm = ByteLM(lm, beam=4)

        async def go():
            if concurrent:
                await asyncio.gather(*(byte_lm.next_byte_logprobs(p) for p in prompts))
            else:
                for p in prompts:
                    await byte_lm.next_byte_logprobs(p)

        run(go())
        return lm.stats.forward_calls, byte_lm.stats.token_requests

    (together, requests), (alone, requests_alone) = forwards(True), forwards(False)
    # the same work (batched forwards differ in the last float bits, so a near tie in the
    # beam may fall the other way) ...
    assert abs(requests - requests_alone) <= 0.05 * requests_alone
    assert together <= alone / 2  # ... in at most half the forwards


def test_canonical_encodings_pass_the_pair_test(smollm):
    texts = [
        "The Fed says rates will stay high.",
        "  Indented code: x = f(1, 2)\n\treturn x",
        "Paris, Parisian, parish; 1234567 and 3.14!",
        "naïve café — über straße",
        "Hello   world !!  ok\t\tz",
    ]
    # and real files: code and prose with every kind of whitespace run
    root = Path(__file__).resolve().parents[3]
    texts += [(root / f).read_text()[:1500] for f in ("llamppl/context.py", "README.md")]
    for text in texts:
        ids = smollm.encode(text)
        assert is_canonical(smollm, ids)
        assert all(canonical_pair(smollm, a, b) for a, b in zip(ids, ids[1:])), text
    par, is_ = smollm.encode(" Par")[0], smollm.encode("is")[0]
    assert smollm.encode(" Paris") == [smollm.encode(" Paris")[0]]  # one token
    assert not canonical_pair(smollm, par, is_)
    assert not is_canonical(smollm, [par, is_])
