"""Small FunctionLM programs shared by the inference tests (each enumerable exactly)."""

from __future__ import annotations

import math

from llamppl import Bernoulli, Categorical, FunctionLM, LMContext, Model

VOCAB = ["a", "b", "c", "."]
EOS = 3


def _logits(ctx: tuple[int, ...]) -> list[float]:
    n = len(ctx)
    last = ctx[-1] if ctx else 0
    return [0.4 + 0.1 * last, 0.2 * n, -0.3 + 0.25 * (last == 1), -0.5 + 0.45 * n]


def toy_lm() -> FunctionLM:
    return FunctionLM(VOCAB, EOS, _logits)


class ConditionProgram(Model):
    """At most one 'b' (a condition), EOS-terminated or cut at 3 tokens: particles finish at different times."""

    def __init__(self, lm, max_tokens: int = 3) -> None:
        super().__init__()
        self.context = LMContext(lm, [0])
        self.max_tokens = max_tokens

    async def step(self) -> None:
        token = await self.sample(self.context.next_token())
        self.condition(str(self.context).count("b") <= 1)
        if token == EOS or len(self.context.generated) >= self.max_tokens:
            self.finish()


class ObserveProgram(Model):
    """Latent class z ~ Categorical; tokens observed from a z-dependent Bernoulli likelihood."""

    def __init__(self, lm) -> None:
        super().__init__()
        self.context = LMContext(lm, [1])
        self.z = None

    async def step(self) -> None:
        if self.z is None:
            self.z = await self.sample(Categorical([0.5, 0.3, 0.2]))
            return
        token = await self.sample(self.context.next_token())
        await self.observe(Bernoulli(0.2 + 0.25 * self.z), int(token) in (0, 2))
        if token == EOS or len(self.context.generated) >= 2:
            self.finish()

    def string_for_serialization(self) -> str:
        return f"z={self.z} {self.context}"


class TwistProgram(Model):
    """Twists by a heuristic of the prefix and undoes it the next step; finally scores a reward."""

    def __init__(self, lm) -> None:
        super().__init__()
        self.context = LMContext(lm, [2])
        self.last_twist = 0.0

    async def step(self) -> None:
        token = await self.sample(self.context.next_token())
        self.twist(-self.last_twist)
        done = token == EOS or len(self.context.generated) >= 3
        if done:
            self.last_twist = 0.0
            self.score(0.7 * str(self.context).count("a"))
            self.finish()
        else:
            self.last_twist = 0.9 * str(self.context).count("a") - 0.4
            self.twist(self.last_twist)


class ProposalProgram(Model):
    """Tokens drawn from a tempered proposal of the same LM, weighted by p/q (plain `def step`)."""

    def __init__(self, lm) -> None:
        super().__init__()
        self.context = LMContext(lm, [0])
        self.proposal_context = LMContext(lm, [0], temp=2.0)

    def step(self) -> None:
        token = self.sample(self.context.next_token(), proposal=self.proposal_context.next_token())
        self.condition("cc" not in str(self.context))
        if token == EOS or len(self.context.generated) >= 3:
            self.finish()

    def string_for_serialization(self) -> str:
        return str(self.context)


class AllFailProgram(Model):
    """Every path violates the condition eventually: Z = 0."""

    def __init__(self, lm) -> None:
        super().__init__()
        self.context = LMContext(lm, [0])

    async def step(self) -> None:
        token = await self.sample(self.context.next_token())
        if token == EOS or len(self.context.generated) >= 2:
            self.condition(False)
            self.finish()


class EarlyOrLate(Model):
    """Step 1 ends the text with probability 0.8 (weight 1); otherwise steps 2 and 3 score 2 and 3.

    Z = 0.8 + 0.2 · 2 · 3 = 2 and π(early) = 0.4: particles finish at different steps, with
    bounded weights (at most 6), so standard errors of Ẑ are honest.
    """

    Z = 2.0
    EARLY_MASS = 0.8  # γ(early) = Z · π(early)

    def __init__(self) -> None:
        super().__init__()
        self.t = 0
        self.early: bool | None = None

    async def step(self) -> None:
        self.t += 1
        if self.t == 1:
            self.early = bool(await self.sample(Bernoulli(0.8)))
            if self.early:
                self.finish()
        else:
            self.score(math.log(self.t))  # log 2, then log 3
            if self.t == 3:
                self.finish()

    def string_for_serialization(self) -> str:
        return "early" if self.early else "late"


PROGRAMS = {
    "condition": ConditionProgram,
    "observe": ObserveProgram,
    "twist": TwistProgram,
    "proposal": ProposalProgram,
}


def total_variation(p: dict, q: dict) -> float:
    keys = set(p) | set(q)
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys)


def exp_or_zero(x: float) -> float:
    return 0.0 if x == -math.inf else math.exp(x)
