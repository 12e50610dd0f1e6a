"""Request coalescing: the concurrent awaits of one event-loop round become ONE batched call.

Every particle of an SMC step awaits its own request (a next-token distribution,
a grammar mask); the backend is fastest when it serves them all at once. A
:class:`Coalescer` collects the requests submitted on one event loop: the first
one schedules a flush task, which yields to the loop until no new request has
arrived during a full round (every runnable coroutine has asked), then passes
them all to ``serve`` in one call and resolves each awaiting future::

    coalescer = Coalescer(lambda xs: [x * x for x in xs])
    squares = await asyncio.gather(*(coalescer.submit(x) for x in range(16)))
    assert coalescer.calls == 1          # 16 awaits, one serve call

An exception raised by ``serve`` is set on every future of that call. Requests
whose awaiting task was cancelled are dropped before serving. Moving to another
event loop forgets the requests pending on the old one. The CPU time of each ``serve``
call is charged to the requests' CPU accounts, evenly per request, when they have any
(:mod:`llamppl.cpu_accounts`: many jobs on one loop, each with its share of every batch).

This is the basics floor: it knows nothing of language models.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from .cpu_accounts import ACCOUNT, Account, shared_call

__all__ = ["Coalescer"]

R = TypeVar("R")
T = TypeVar("T")


class Coalescer(Generic[R, T]):
    """Serve the requests awaited concurrently on one event loop with one call of ``serve``.

    Parameters
    ----------
    serve : Callable[[list[R]], Sequence[T]]
        Maps the round's live requests, in submission order, to one result each.

    Attributes
    ----------
    calls : int
        How many times ``serve`` was called (one per round with a live request).
    """

    def __init__(self, serve: Callable[[list[R]], Sequence[T]]) -> None:
        if not callable(serve):
            raise TypeError(f"serve must be callable, got {type(serve).__name__}")
        self.serve = serve
        self.calls = 0
        self._pending: list[tuple[R, asyncio.Future, Account | None]] = []
        self._flush_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def submit(self, request: R) -> T:
        """Queue ``request`` for this round's batched call and await its result."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._pending, self._flush_task = loop, [], None
        fut = loop.create_future()
        self._pending.append((request, fut, ACCOUNT.get()))
        if self._flush_task is None:  # everyone's task: charged to no one's CPU account
            context = contextvars.copy_context()
            context.run(ACCOUNT.set, None)
            self._flush_task = context.run(loop.create_task, self._flush())
        return await fut

    async def _flush(self) -> None:
        """Wait until no new request arrives during a loop round, then serve them all."""
        seen = -1
        while seen != len(self._pending):
            seen = len(self._pending)
            await asyncio.sleep(0)
        pending, self._pending, self._flush_task = self._pending, [], None
        live = [(r, f, a) for r, f, a in pending if not f.cancelled()]
        if not live:
            return
        self.calls += 1
        try:  # one call for the round; its CPU time charged per request (module docstring)
            results = shared_call([a for _, _, a in live], self.serve, [r for r, _, _ in live])
        except BaseException as exc:  # surface the error at every awaiting call
            for _, f, _ in live:
                if not f.done():
                    f.set_exception(exc)
            return
        for (_, f, _), res in zip(live, results):
            if not f.done():
                f.set_result(res)
