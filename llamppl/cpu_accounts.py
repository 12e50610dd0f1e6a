"""Who used the CPU: accounts of process CPU time for jobs that share one event loop.

Jobs running concurrently on one event loop (:func:`~llamppl.inference.jobs.run_jobs`)
interleave their Python steps and share batched calls: one LM forward serves the rows of
every job. An :class:`Account` collects one job's CPU seconds from both::

    account = Account()
    context = contextvars.copy_context()
    context.run(ACCOUNT.set, account)
    with timed_tasks():                                   # on the running loop
        task = context.run(asyncio.ensure_future, job())  # job's tasks and their children
    ...
    account.seconds                                       # its steps + its rows' shares

- **Its own steps.** While :func:`timed_tasks` is on, every task created in a context whose
  :data:`ACCOUNT` holds an account (a job's task, and the tasks it creates, which inherit its
  context) runs its coroutine through :class:`TimedCoroutine`: each step (``send`` /
  ``throw``) adds the process CPU time it took.
- **Its rows of shared calls.** :class:`~llamppl.batching.Coalescer` serves a round's requests
  in one call through :func:`shared_call`, which splits that call's CPU time evenly among the
  requests: a forward of R rows charges each row's account 1/R of it.

Nothing is counted twice: a measurement excludes what was measured inside it (a step that
runs a batched call keeps only the rest of its time). :func:`measured` is the total measured
so far; the process CPU it does not cover is the event loop's own work between steps, which
a caller can split as it likes (``run_jobs`` splits it evenly among the jobs then running).
Time is ``time.process_time()``: every thread of the process, so a forward's torch threads
count. With no account set, nothing is wrapped and a shared call costs one check.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

__all__ = ["ACCOUNT", "Account", "TimedCoroutine", "measured", "shared_call", "timed_tasks"]

T = TypeVar("T")


class Account:
    """CPU seconds charged to one job (``seconds``)."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0

    def __repr__(self) -> str:
        return f"Account(seconds={self.seconds:.6f})"


#: The account that the code running in this context charges (None: nobody's).
ACCOUNT: ContextVar[Account | None] = ContextVar("llamppl_cpu_account", default=None)

_measured = 0.0  # CPU seconds measured so far, by steps and shared calls (module docstring)


def measured() -> float:
    """CPU seconds measured so far by timed steps and shared calls (charged or not)."""
    return _measured


@contextlib.contextmanager
def _own_time(share: Callable[[float], None]) -> Iterator[None]:
    """Measure the CPU of the block minus what was measured inside it; ``share`` gets it."""
    global _measured
    t0, inner0 = time.process_time(), _measured
    try:
        yield
    finally:
        own = max(0.0, time.process_time() - t0 - (_measured - inner0))
        _measured += own
        share(own)


def shared_call(accounts: Sequence[Account | None], fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, its CPU time split evenly among ``accounts`` (one per request; None:
    a request nobody is charged for)."""
    if not any(a is not None for a in accounts):
        return fn(*args)

    def share(seconds: float) -> None:
        each = seconds / len(accounts)
        for a in accounts:
            if a is not None:
                a.seconds += each

    with _own_time(share):
        return fn(*args)


class TimedCoroutine(Coroutine):
    """A coroutine whose every step's CPU time goes to ``account`` (what a task runs)."""

    __slots__ = ("coro", "account")

    def __init__(self, coro: Coroutine, account: Account) -> None:
        self.coro, self.account = coro, account

    def _charge(self, seconds: float) -> None:
        self.account.seconds += seconds

    def send(self, value: Any) -> Any:
        with _own_time(self._charge):
            return self.coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        with _own_time(self._charge):
            if val is None and tb is None:
                return self.coro.throw(typ)
            return self.coro.throw(typ, val, tb)

    def close(self) -> None:
        self.coro.close()

    def __await__(self):
        return self.coro.__await__()

    def __repr__(self) -> str:
        return f"TimedCoroutine({self.coro!r})"


#: Loops with the timing task factory on: id(loop) -> (users, the factory, the one before).
_INSTALLED: dict[int, tuple[int, Callable, Callable | None]] = {}


@contextlib.contextmanager
def timed_tasks(loop: asyncio.AbstractEventLoop | None = None) -> Iterator[None]:
    """On ``loop`` (default: the running one), wrap the coroutine of every task created in a
    context with an :data:`ACCOUNT` in a :class:`TimedCoroutine`.

    The loop's previous task factory stays underneath (it creates the tasks) and is put back
    when the last of overlapping ``timed_tasks`` blocks on the loop ends."""
    loop = loop or asyncio.get_running_loop()
    key = id(loop)
    if key in _INSTALLED:
        users, factory, previous = _INSTALLED[key]
        _INSTALLED[key] = (users + 1, factory, previous)
    else:
        previous = loop.get_task_factory()

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future:
            context = kwargs.get("context")
            account = ACCOUNT.get() if context is None else context.get(ACCOUNT)
            if account is not None and not isinstance(coro, TimedCoroutine):
                coro = TimedCoroutine(coro, account)
            if previous is not None:
                return previous(loop, coro, **kwargs)
            return asyncio.Task(coro, loop=loop, **kwargs)

        _INSTALLED[key] = (1, factory, previous)
        loop.set_task_factory(factory)
    try:
        yield
    finally:
        users, factory, previous = _INSTALLED[key]
        if users > 1:
            _INSTALLED[key] = (users - 1, factory, previous)
        else:
            del _INSTALLED[key]
            if loop.get_task_factory() is factory:  # unless someone replaced it since
                loop.set_task_factory(previous)
