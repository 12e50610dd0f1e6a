"""The torch thread count llamppl uses on CPU unless the user chose one.

torch starts with one intra-op thread per core. On a machine whose cores are
busy with other work, those threads wait for each other at every parallel
region, and a small model such as the embedded SmolLM2-135M runs 20-30 times
slower than with one thread (``benchmarks/bench_threads.py``; the numbers are in
``docs/quickstart.md``). With few threads the worst case is mild: one thread on
an idle 2-core machine is at most about as slow as the runtime's default.

So when a loader puts a model on the CPU it calls :func:`apply_default_threads`,
which sets ``torch.set_num_threads(default_num_threads())`` — a quarter of the
CPUs this process may use, at least 1 and at most 4 — unless the user has chosen:

- ``LLAMPPL_NUM_THREADS=k`` (a positive integer) sets ``k`` threads;
- ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` set: torch's own choice is kept;
- ``torch.set_num_threads(k)`` called after ``import llamppl`` and before the
  load: kept. (The count at import is the reference; a call made before
  ``import llamppl`` cannot be told from torch's default, so set
  ``LLAMPPL_NUM_THREADS`` in that case.)

The policy is applied once per process; a later ``torch.set_num_threads`` wins.
"""

from __future__ import annotations

import os

import torch

from .validation import is_integer

__all__ = ["default_num_threads", "apply_default_threads", "user_threads", "ENV_VAR"]

ENV_VAR = "LLAMPPL_NUM_THREADS"
_USER_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_AT_IMPORT = torch.get_num_threads()
_APPLIED = False


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def default_num_threads(cpus: int | None = None) -> int:
    """Threads for a CPU model on a machine with ``cpus`` usable CPUs: ``clamp(cpus // 4, 1, 4)``.

    A quarter leaves the threads a core each while up to three quarters of the
    machine is busy; past 4 threads a model of this size gains little.
    """
    if cpus is None:
        cpus = _available_cpus()
    if not is_integer(cpus) or cpus < 1:
        raise ValueError(f"cpus must be a positive integer, got {cpus!r}")
    return max(1, min(4, cpus // 4))


def user_threads() -> int | str | None:
    """The user's choice: ``LLAMPPL_NUM_THREADS`` as an int, ``"keep"`` if threads were chosen otherwise, else None.

    Raises ``ValueError`` naming ``LLAMPPL_NUM_THREADS`` if it is not a positive integer.
    """
    text = os.environ.get(ENV_VAR, "").strip()
    if text:
        try:
            k = int(text)
        except ValueError:
            k = 0
        if k < 1:
            raise ValueError(f"{ENV_VAR} must be a positive integer, got {text!r}")
        return k
    if any(os.environ.get(name, "").strip() for name in _USER_ENV):
        return "keep"
    if torch.get_num_threads() != _AT_IMPORT:
        return "keep"
    return None


def apply_default_threads(device: str | torch.device | None = None) -> int | None:
    """Set torch's thread count for a model loaded onto ``device`` (None = CPU); return it, or None if left alone.

    Does nothing for a non-CPU device, after the first call that set threads in
    this process, or when the user chose (see the module docstring).
    """
    global _APPLIED
    if device is not None and torch.device(device).type != "cpu":
        return None
    choice = user_threads()
    if isinstance(choice, int):
        torch.set_num_threads(choice)
        return choice
    if choice == "keep" or _APPLIED:
        return None
    _APPLIED = True
    k = default_num_threads()
    torch.set_num_threads(k)
    return k
