"""Catch a primitive that a step called without ``await``.

In an ``async def step``, ``self.sample(...)`` returns a coroutine. Written
without ``await``, the step goes on with a coroutine object instead of a token,
never finishes, and Python prints only "coroutine ... was never awaited" when
the object is collected. The primitives (``sample``, ``observe``, ``call``,
``intervene``; also a SubModel's) register their coroutine with
:func:`expect_await`; the engine interface runs every hook inside
:func:`awaits_checked`, which at the end of the hook raises a ``TypeError`` for
any registered coroutine still unstarted, saying what to write::

    with awaits_checked("MyModel.step"):
        await model.step()        # a forgotten `await self.sample(...)` -> TypeError here

The registry is a context variable, so particles stepped concurrently (each in
its own asyncio task) keep separate lists. A plain ``def step`` runs in a
greenlet whose primitives return values, never coroutines, so it registers nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["expect_await", "awaits_checked"]

C = TypeVar("C", bound=Coroutine[Any, Any, Any])

_CREATED: contextvars.ContextVar[list[tuple[str, Coroutine]] | None] = contextvars.ContextVar(
    "llamppl_unawaited", default=None
)

_HOW = {
    "sample": "token = await self.sample(...)",
    "observe": "await self.observe(...)",
    "call": "result = await self.call(...)",
    "intervene": "await self.intervene(...)",
}


def expect_await(primitive: str, coro: C) -> C:
    """Register ``coro``, made by the primitive ``primitive``, with the running hook; return it."""
    created = _CREATED.get()
    if created is not None:
        created.append((primitive, coro))
    return coro


@contextlib.contextmanager
def awaits_checked(hook: str) -> Iterator[None]:
    """Run a hook (named ``hook``, e.g. ``"MyModel.step"``); ``TypeError`` if it left a primitive unawaited.

    When the hook raises, its error propagates unchanged and the unawaited
    coroutines are closed quietly (they would only add a warning).
    """
    created: list[tuple[str, Coroutine]] = []
    token = _CREATED.set(created)
    try:
        yield
    except BaseException:
        _close_unstarted(created)
        raise
    finally:
        _CREATED.reset(token)
    missed = _close_unstarted(created)
    if missed:
        names = ", ".join(dict.fromkeys(f"self.{m}(...)" for m in missed))
        raise TypeError(
            f"{hook} called {names} without `await`, so it got a coroutine instead of a value; "
            f"in an `async def` write `{_HOW.get(missed[0], 'await ...')}` "
            "(every sample / observe / call / intervene must be awaited)"
        )


def _close_unstarted(created: list[tuple[str, Coroutine]]) -> list[str]:
    """Close the coroutines never started; return the primitives that made them."""
    missed = []
    for primitive, coro in created:
        if inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
            coro.close()
            missed.append(primitive)
    return missed
