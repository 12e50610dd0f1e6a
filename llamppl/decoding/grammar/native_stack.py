"""A large native stack for llguidance's recursive work: a small pool of kept worker threads.

llguidance compiles a JSON Schema recursively, about 8 KB of native stack per ``$ref`` hop,
so a 1,000-deep chain of references overflows a default 8 MB thread stack: a segfault,
not an exception. Everything that compiles a grammar therefore runs on a thread with a
:data:`NATIVE_STACK` stack: the compile tiers of
:mod:`~llamppl.decoding.grammar.compile`, the validation of a grammar string, and the
build of a grammar's first matcher (:mod:`~llamppl.decoding.grammar.matcher`), which
compiles it again. Copies of a matcher, masks and token steps do not recurse per hop and
stay on the caller's thread.

The threads are kept and reused (at most :data:`MAX_IDLE` idle): a fresh thread with a
256 MB stack costs 2–3 ms before its work starts (its stack is mapped and faulted in
afresh, with transparent huge pages as 2 MB pages to zero), a kept one about 20 µs. A
caller may stop waiting (:mod:`~llamppl.decoding.grammar.compile`'s time bound): the call
runs to its end and its worker then returns to the pool. Work started on a worker that
calls :func:`on_native_stack` again runs in place::

    call = NativeCall(work)          # work() starts on a worker
    if call.wait(timeout=10.0):      # False: still running, the caller may give up
        value = call.result()        # work's value, or its exception raised here
    on_native_stack(work)            # the same, waited for
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["MAX_IDLE", "NATIVE_STACK", "NativeCall", "on_native_stack"]

#: The workers' stack (reserved, committed only as used): 256 MB takes chains of
#: references up to llguidance's own "schema too large" limit (measured up to 300,000 hops).
NATIVE_STACK = 256 << 20
#: Idle workers kept for the next call; a worker finishing a call beyond them ends.
MAX_IDLE = 2

_T = TypeVar("_T")
_LOCAL = threading.local()  # .worker: this thread is a worker (nested calls run in place)


class _Pool:
    """The idle workers, and the lock that guards them and ``threading.stack_size``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[_Worker] = []


_POOL = _Pool()


def _forget_workers() -> None:
    """After ``fork``: the parent's workers do not exist in the child, nor does its lock
    holder."""
    global _POOL
    _POOL = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers)


class NativeCall(Generic[_T]):
    """``work()`` running on a worker thread with a :data:`NATIVE_STACK` stack.

    Started at construction (on an idle worker, or on a new one); :meth:`wait` for it,
    then :meth:`result`. Nobody needs to wait: an abandoned call runs to its end. The
    worker thread bears ``name`` while it runs the call (``threading.enumerate`` shows
    which calls still run).
    """

    def __init__(self, work: Callable[[], _T], name: str = "llamppl-native-call") -> None:
        self.work, self.name = work, name
        self.finished = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        pool = _POOL
        with pool.lock:
            worker = pool.idle.pop() if pool.idle else None
        (worker or _Worker(pool)).jobs.put(self)

    def run(self) -> None:
        """Run the work, keeping its value or its exception (on the worker)."""
        thread = threading.current_thread()
        idle, thread.name = thread.name, self.name
        try:
            self.value = self.work()
        except BaseException as exc:  # noqa: BLE001 - raised again by result()
            self.error = exc
        finally:
            thread.name = idle

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the work finished within ``timeout`` seconds (None: waits for it)."""
        return self.finished.wait(timeout)

    def result(self) -> _T:
        """The work's value, or its exception raised here; RuntimeError before it finished."""
        if not self.finished.is_set():
            raise RuntimeError("the native-stack call has not finished")
        if self.error is not None:
            raise self.error
        return self.value


class _Worker:
    """A daemon thread with a :data:`NATIVE_STACK` stack that runs calls one at a time and,
    between them, waits in its pool (or ends when :data:`MAX_IDLE` others wait there)."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.jobs: queue.SimpleQueue[NativeCall] = queue.SimpleQueue()
        thread = threading.Thread(target=self.serve, name="llamppl-native-stack", daemon=True)
        with pool.lock:  # threading.stack_size is process-wide: set, start, restore
            try:
                previous = threading.stack_size(NATIVE_STACK)
            except (ValueError, RuntimeError):  # a platform without settable stacks
                thread.start()
                return
            try:
                thread.start()
            except RuntimeError:  # cannot reserve the stack: start with the default one
                threading.stack_size(previous)
                thread.start()
            finally:
                threading.stack_size(previous)

    def serve(self) -> None:
        _LOCAL.worker = True
        while True:
            call = self.jobs.get()
            call.run()
            with self.pool.lock:  # back in the pool before the caller hears of it, so a
                keep = len(self.pool.idle) < MAX_IDLE  # caller's next call finds it idle
                if keep:
                    self.pool.idle.append(self)
            call.finished.set()
            if not keep:
                return


def on_native_stack(work: Callable[[], _T]) -> _T:
    """``work()`` on a :data:`NATIVE_STACK` worker, waited for (its exceptions raised here);
    on a worker already, a plain call."""
    if getattr(_LOCAL, "worker", False):
        return work()
    call = NativeCall(work)
    call.wait()
    return call.result()
