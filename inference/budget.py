"""Memory a run needs, estimated before it starts; a run that cannot fit is refused.

``n_particles=10**12`` would otherwise start cloning and never end. The estimate
(:func:`run_memory`), in bytes::

    N · (particle + Σ_lm 4·V_lm + 64)  +  Σ_lm 4·V_lm·max_cached_logprobs_lm

- *particle*: the Python memory of one ``model.clone()``, measured by cloning
  once under ``tracemalloc`` (LMs are shared by clones and not counted);
- ``4·V``: one float32 next-token log-probability row per particle per step
  from each LM the model holds (V its vocabulary size);
- 64: the engine's per-particle arrays (weights, ancestors, ESS work);
- the LM's bounded cache of log-prob rows (``max_cached_logprobs``; the K/V pool
  is allocated when the LM is built, so it is already in use).

:func:`check_memory` compares it with the memory the OS reports available
(``MemAvailable`` in ``/proc/meminfo``, or ``sysconf``) and raises a
``ValueError`` with both numbers when it does not fit::

    check_memory(model, n_particles, lms, argument="n_particles=64")
"""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Sequence

from llamppl.lm.base import LanguageModel
from llamppl.modeling import Model

__all__ = ["available_memory", "particle_bytes", "run_memory", "check_memory"]

ENGINE_BYTES_PER_PARTICLE = 64


def available_memory() -> int | None:
    """Bytes of memory the OS can give this process now, or None when it does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def particle_bytes(model: Model) -> int:
    """Python memory held by one clone of ``model``, measured by cloning it once."""
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        clone = model.clone()
        size = tracemalloc.get_traced_memory()[0] - before
    finally:
        if not tracing:
            tracemalloc.stop()
    del clone
    return max(size, 0)


def run_memory(model: Model, n_particles: int, lms: Sequence[LanguageModel]) -> tuple[int, str]:
    """``(bytes, breakdown)``: the estimate of the module docstring for ``n_particles`` alive at once."""
    particle = particle_bytes(model)
    rows = sum(4 * lm.vocab_size for lm in lms)
    cache = sum(4 * lm.vocab_size * int(getattr(lm, "max_cached_logprobs", 0)) for lm in lms)
    per = particle + rows + ENGINE_BYTES_PER_PARTICLE
    why = (
        f"{n_particles} particles × {_size(per)} each ({_size(particle)} measured by cloning the "
        f"model once + {_size(rows)} of next-token log-probs + {ENGINE_BYTES_PER_PARTICLE} B of "
        f"engine arrays) + {_size(cache)} of LM cache"
    )
    return n_particles * per + cache, why


def check_memory(
    model: Model, n_particles: int, lms: Sequence[LanguageModel], *, argument: str
) -> None:
    """``ValueError`` naming ``argument`` when the run cannot fit in the available memory."""
    free = available_memory()
    if free is None:
        return
    need, why = run_memory(model, n_particles, lms)
    if need > free:
        raise ValueError(
            f"{argument} needs about {_size(need)} of memory ({why}), but only {_size(free)} "
            "is available; use fewer particles"
        )


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"
