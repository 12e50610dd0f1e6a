"""Submodels: reusable pieces of a ``step`` that score into their caller's particle.

A :class:`SubModel` has an ``async def forward(self)``; ``await self.call(sub)``
inside a model's ``step`` runs ``forward`` within that step. Its ``sample`` /
``observe`` / ``condition`` / ``twist`` / ``score`` go to the calling particle,
so the potential G_t of the step (LLaMPPL paper §2.3) is the product of the
terms scored by the step and by every submodel it calls; submodels nest::

    @submodel
    async def coin_pair(self, p):
        a = await self.sample(Bernoulli(p))
        b = await self.sample(Bernoulli(p))
        return a and b

    async def step(self):
        both = await self.call(coin_pair(0.5))
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from .awaiting import expect_await

__all__ = ["SubModel", "submodel", "check_submodel"]


class SubModel:
    """A sub-program run inside the calling particle's step (see the module docstring).

    Subclasses implement ``async def forward(self)``; during ``forward``,
    ``self.parent`` is the particle (a ``Model``) that called it.
    """

    parent: Any = None

    async def forward(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement async forward()")

    async def run_with_parent(self, parent: Any) -> Any:
        """Run ``forward`` with every primitive scoring into ``parent``; returns its result."""
        previous, self.parent = self.parent, parent
        try:
            return await self.forward()
        finally:
            self.parent = previous

    # Primitives: always the awaitable form, also when the parent runs a plain ``def step``
    # (a submodel's ``forward`` is async, and is awaited on the parent's event loop). Each
    # coroutine is watched, so a forgotten ``await`` fails at the end of the parent's step.
    def sample(self, dist, proposal=None):
        return expect_await("sample", self.parent.sample_async(dist, proposal))

    def observe(self, dist, value):
        return expect_await("observe", self.parent.observe_async(dist, value))

    def intervene(self, dist, value):
        return expect_await("intervene", self.parent.intervene_async(dist, value))

    def call(self, sub: SubModel) -> Any:
        check_submodel(sub)
        return expect_await("call", sub.run_with_parent(self.parent))

    def condition(self, ok: bool) -> None:
        self.parent.condition(ok)

    def score(self, log_w: float) -> None:
        self.parent.score(log_w)

    def twist(self, amount: float) -> None:
        self.parent.twist(amount)

    def untwist(self) -> None:
        self.parent.untwist()

    def finish(self) -> None:
        self.parent.finish()


def check_submodel(sub: Any) -> None:
    """``TypeError`` unless ``sub`` is a SubModel whose ``forward`` is an ``async def``."""
    if not isinstance(sub, SubModel):
        raise TypeError(
            f"call(sub) needs a SubModel (a SubModel subclass instance or an @submodel function's result), got {type(sub).__name__}"
        )
    if not inspect.iscoroutinefunction(sub.forward):
        raise TypeError(
            f"call(sub): {type(sub).__name__}.forward must be an `async def`, got a plain function"
        )


def submodel(fn: Callable[..., Any]) -> Callable[..., SubModel]:
    """Turn ``async def fn(self, *args)`` into a factory of SubModels running ``fn``.

    ``fn(*args, **kwargs)`` then returns a SubModel; ``await model.call(fn(...))``
    runs ``fn`` with ``self`` bound to that SubModel.
    """
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"@submodel needs an `async def` function, got {fn!r}")

    class _FunctionSubModel(SubModel):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.args, self.kwargs = args, kwargs

        async def forward(self) -> Any:
            return await fn(self, *self.args, **self.kwargs)

        def __repr__(self) -> str:
            return f"<submodel {fn.__name__}>"

    _FunctionSubModel.__name__ = _FunctionSubModel.__qualname__ = fn.__name__

    @functools.wraps(fn)
    def make(*args: Any, **kwargs: Any) -> SubModel:
        return _FunctionSubModel(*args, **kwargs)

    return make
