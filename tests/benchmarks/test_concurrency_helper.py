"""``benchmarks/_concurrency.py``: the benchmarks' ``--concurrency`` runs problems at once with
the records they give one after another, each with its share of the CPU."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import _concurrency as C  # noqa: E402

from llamppl import FunctionLM, LMContext, Model  # noqa: E402
from llamppl.inference import smc_standard  # noqa: E402

VOCAB = ["a", "b", "c", "."]


def lm() -> FunctionLM:
    return FunctionLM(
        VOCAB,
        3,
        lambda ctx: (
            [math.cos(i + 0.7 * len(ctx) + ctx[-1]) for i in range(3)] + [0.3 * len(ctx) - 1]
        ),
    )


class NoDoubleB(Model):
    def __init__(self, lm, prompt: str) -> None:
        super().__init__()
        self.context = LMContext(lm, lm.encode(prompt))

    async def step(self) -> None:
        token = await self.sample(self.context.next_token())
        self.condition("bb" not in str(self.context))
        if token == 3 or len(self.context.generated) >= 4:
            self.finish()


async def solve(lm, prompt: str, n: int, *, seed: int) -> dict:
    if prompt == "boom":
        raise RuntimeError("this problem fails")
    result = await smc_standard(NoDoubleB(lm, prompt), n, 0.5, seed=seed)
    return {"prompt": prompt, "log_ml": result.log_ml, "texts": sorted(map(str, result.particles))}


PROBLEMS = [(solve, (p, 6), s) for p in ("a", "b", "ab", "boom", "c") for s in (0, 1)]


def _records(k: int) -> dict[int, dict]:
    got: dict[int, dict] = {}
    C.solve_all(lm(), PROBLEMS, k, lambda i, rec: got.__setitem__(i, rec))
    return got


def test_problems_at_once_give_the_records_they_give_one_after_another():
    alone, together = _records(1), _records(len(PROBLEMS))
    assert sorted(alone) == sorted(together) == list(range(len(PROBLEMS)))
    for i in alone:
        a, b = alone[i], together[i]
        assert b["concurrency"] == len(PROBLEMS) and a["concurrency"] == 1
        if PROBLEMS[i][1][0] == "boom":
            assert "this problem fails" in a["error"] and "this problem fails" in b["error"]
            continue
        assert (a["log_ml"], a["texts"]) == (b["log_ml"], b["texts"])
        assert a["cpu_seconds"] > 0 and b["cpu_seconds"] > 0 and b["wall_seconds"] > 0


@pytest.mark.parametrize(
    ("given", "particles", "problems", "k"),
    [(None, 8, 100, C.MAX_ROWS // 8), (None, 8, 5, 5), (None, 1000, 5, 1), (3, 8, 100, 3)],
)
def test_default_concurrency_is_all_within_the_row_bound(given, particles, problems, k):
    assert C.concurrency(given, particles, problems) == k
