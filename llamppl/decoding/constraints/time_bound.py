"""A time bound on each constraint check: a check that runs too long ends its particle, not the run.

A user's predicate can take arbitrarily long on some prefix (a backtracking regular
expression, a parser on pathological input). :func:`bounded_call` runs one check
under the current bound (set for a block of code with :func:`time_bound`, default
:data:`DEFAULT_CHECK_TIMEOUT` seconds); past it, :class:`CheckTimeout` is raised *inside* the check
(``PyThreadState_SetAsyncExc``, delivered at the check's next Python bytecode, on
whatever thread the run uses, Jupyter's worker thread included), and the program
that called it kills the particle with the cause ``"check timed out"``. One
watchdog thread per process serves every bound; arming one costs a lock and two
assignments, so a 49,152-call mask pays about 0.1 µs per call::

    with time_bound(1.0):
        try:
            ok = bounded_call(predicate, text)
        except CheckTimeout:
            ...                               # the particle dies; the run goes on

Code running inside a C extension cannot be interrupted until it returns to Python:
give such checks their own limit (the ``regex`` package's ``timeout=``, which
:func:`~llamppl.decoding.constraints.protocol.regex_prefix` passes on every call).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from llamppl.validation import is_real

__all__ = [
    "CheckTimeout",
    "DEFAULT_CHECK_TIMEOUT",
    "bounded_call",
    "check_timeout_seconds",
    "current_bound",
    "time_bound",
]

T = TypeVar("T")

#: Default bound on one check, in seconds.
DEFAULT_CHECK_TIMEOUT = 2.0
_POLL = 0.01  # the watchdog's period (s): a bound fires at most this late
_BOUND: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "llamppl_check_bound", default=DEFAULT_CHECK_TIMEOUT
)


class CheckTimeout(BaseException):
    """A constraint check ran past its time bound.

    A ``BaseException`` (like ``KeyboardInterrupt``), so a check that ends in
    ``except Exception: return False`` cannot turn a time-out into a rejection; and a check
    that swallows it anyway (``except BaseException``) is caught out by :func:`bounded_call`,
    which raises it again when the call returns after its bound fired.
    """


def check_timeout_seconds(name: str, value: object) -> float | None:
    """``value`` as a positive number of seconds, or None for no bound (``ValueError`` naming it)."""
    if value is None:
        return None
    if not is_real(value) or not value > 0 or value == float("inf"):
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")
    return float(value)


class _Watchdog:
    """One daemon thread that raises :class:`CheckTimeout` in threads whose check overran."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.armed: dict[int, tuple[float, int]] = {}  # thread id -> (deadline, ticket)
        self.fired: set[int] = set()  # tickets whose bound fired and that are not yet disarmed
        self.ticket = 0
        self.thread: threading.Thread | None = None

    def arm(self, seconds: float) -> int:
        with self.lock:
            self.ticket += 1
            self.armed[threading.get_ident()] = (time.monotonic() + seconds, self.ticket)
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._watch, name="llamppl-check-watchdog", daemon=True
                )
                self.thread.start()
            return self.ticket

    def disarm(self, ticket: int) -> bool:
        """Disarm ``ticket``; True when its bound fired (the check ran too long), in which case
        an exception still pending for this thread is withdrawn: the caller raises its own."""
        tid = threading.get_ident()
        with self.lock:
            entry = self.armed.get(tid)
            if entry is not None and entry[1] == ticket:
                del self.armed[tid]
                return False
            fired = ticket in self.fired
            self.fired.discard(ticket)
            if fired:  # not yet delivered (or delivered and swallowed): clear it, never stray
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), None)
            return fired

    def _watch(self) -> None:
        while True:
            time.sleep(_POLL)
            now = time.monotonic()
            with self.lock:  # a check that disarms first is never interrupted
                late = [tid for tid, (deadline, _) in self.armed.items() if deadline <= now]
                for tid in late:
                    _, ticket = self.armed.pop(tid)  # fire once: no stray exception after the check
                    self.fired.add(ticket)
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(tid), ctypes.py_object(CheckTimeout)
                    )


_WATCHDOG = _Watchdog()


def current_bound() -> float | None:
    """The bound on one check in this context (seconds; None for none)."""
    return _BOUND.get()


@contextlib.contextmanager
def time_bound(seconds: float | None) -> Iterator[None]:
    """Bound every check made inside the block by ``seconds`` (None: no bound)."""
    token = _BOUND.set(check_timeout_seconds("check_timeout", seconds))
    try:
        yield
    finally:
        _BOUND.reset(token)


def bounded_call(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, or :class:`CheckTimeout` once it has run for the current bound.

    A call whose bound fired raises :class:`CheckTimeout` even when ``fn`` caught the
    exception and returned: its answer was cut short, so it is never taken as a verdict.
    """
    seconds = _BOUND.get()
    if seconds is None:
        return fn(*args)
    ticket = _WATCHDOG.arm(seconds)
    fired = False
    try:
        result = fn(*args)
    finally:
        fired = _WATCHDOG.disarm(ticket)
    if fired:
        raise CheckTimeout(f"check timed out (over {seconds:g} s)")
    return result
