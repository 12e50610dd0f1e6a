"""Token healing in the token view: the healed context's posterior and weight are exact."""

from __future__ import annotations

import math

import pytest
from byte_programs import ambiguous_lm, brute_prefix_logprob

from llamppl import LMContext, Model, run
from llamppl.inference import enumerate_exact
from llamppl.lm.bytes.healing import after_token, consistent_mask, heal_prompt


class Heal(Model):
    def __init__(self, lm, prompt):
        super().__init__()
        self.context = LMContext(lm, prompt, heal=True)

    async def step(self):
        await self.call(self.context.heal())
        self.finish()

    def string_for_serialization(self):
        return repr(tuple(self.context.generated))


def brute_healing(lm, kept, rest):
    """{token path: p(path | kept)} over the paths that re-spell ``rest`` (each token extends
    the rest or is a proper prefix of it)."""
    out = {}

    def dfs(path, rest, logp):
        row = lm.logprobs(tuple(kept) + path)
        for w in range(lm.vocab_size):
            if w in lm.eos_token_ids:
                continue
            t = lm.vocab[w]
            if t.startswith(rest):
                out[path + (w,)] = math.exp(logp + float(row[w]))
            elif rest.startswith(t):
                dfs(path + (w,), rest[len(t) :], logp + float(row[w]))

    dfs((), rest, 0.0)
    return out


@pytest.mark.parametrize("prompt", [[1, 0, 2], [0, 3], [4, 2]])
def test_healing_posterior_and_weight_are_exact(prompt):
    lm = ambiguous_lm()
    kept, rest = heal_prompt(lm, prompt)
    assert kept == prompt[:-1] and rest == lm.vocab[prompt[-1]].encode()
    result = run(enumerate_exact(Heal(lm, prompt)))
    target = brute_healing(lm, kept, rest.decode())
    z = sum(target.values())
    # Z = P(the text after the kept tokens starts with the backed-off bytes): the covering sum
    assert result.log_ml == pytest.approx(math.log(z), abs=1e-9)
    assert math.log(z) == pytest.approx(
        brute_prefix_logprob(lm, rest.decode(), tuple(kept)), abs=1e-9
    )
    for path, p in target.items():
        assert result.posterior[repr(path)] == pytest.approx(p / z, abs=1e-9)
    assert len(result.posterior) == len(target)


def test_healed_context_shows_the_text_after_the_prompt_and_refuses_an_unweighted_draw():
    lm = ambiguous_lm()
    ctx = LMContext(lm, "bab", heal=True)  # encodes as "ba" "b": "b" is backed off
    assert ctx.healing == b"b" and lm.decode(ctx.tokens) == "ba"
    with pytest.raises(ValueError, match="heal_dist"):
        ctx.next_token()
    mask = consistent_mask(lm, b"ab")
    assert [lm.vocab[i] for i in mask.nonzero().flatten().tolist()] == ["a", "ab", "aba"]
    assert after_token(lm, b"ab", lm.vocab.index("a")) == b"b"
    assert after_token(lm, b"ab", lm.vocab.index("aba")) == b""
    assert after_token(lm, b"ab", lm.vocab.index("b")) is None
    ctx.extend(lm.vocab.index("bb"))
    assert ctx.healing == b"" and str(ctx) == "b"
    plain = LMContext(lm, "bab")
    assert plain.healing == b"" and lm.decode(plain.tokens) == "bab"
