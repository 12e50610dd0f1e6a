"""``run``: execute an inference coroutine from synchronous code, even inside a running loop.

In a plain script it uses ``asyncio.run``. In Jupyter, where an event loop is
already running in this thread, it runs the coroutine on a fresh loop in a
worker thread and blocks until it finishes::

    result = llamppl.run(smc_standard(model, 16, seed=0))
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["run"]

T = TypeVar("T")


def run(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` to completion and return its result."""
    if not asyncio.iscoroutine(awaitable) and not isinstance(awaitable, Awaitable):
        raise TypeError(f"run() needs a coroutine or awaitable, got {type(awaitable).__name__}")

    async def main() -> T:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="llamppl-run"
    ) as pool:
        return pool.submit(asyncio.run, main()).result()
