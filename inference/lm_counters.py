"""Work counters of the language models a program uses, read before and after a run.

:class:`LMCounters` finds every :class:`~llamppl.lm.base.LanguageModel` a model
refers to (a few attribute levels deep), snapshots their ``stats`` and reports the
run's difference in ``SMCResult.stats``::

    counters = LMCounters(model)
    ...                                   # the run
    stats = counters.finish(steps=t)      # {"time_s": ..., "forward_calls": ..., ...}
"""

from __future__ import annotations

import time

from llamppl.lm.base import LanguageModel
from llamppl.modeling import Model

__all__ = ["LMCounters"]


class LMCounters:
    """Snapshot of the work counters of every LM a model refers to, to report a run's LM work."""

    FIELDS = ("batch_calls", "forward_calls", "tokens_run", "cache_hits")

    def __init__(self, model: Model) -> None:
        self.lms = _find_lms(model)
        self.t0 = time.perf_counter()
        self.start = [self._read(lm) for lm in self.lms]

    @classmethod
    def _read(cls, lm: LanguageModel) -> dict[str, int]:
        return {f: getattr(lm.stats, f) for f in cls.FIELDS}

    def finish(self, **extra: object) -> dict[str, object]:
        stats: dict[str, object] = {"time_s": time.perf_counter() - self.t0, **extra}
        for lm, before in zip(self.lms, self.start):
            now = self._read(lm)
            for k, v in now.items():
                stats[k] = stats.get(k, 0) + v - before[k]
        return stats


def _find_lms(model: Model) -> list[LanguageModel]:
    found: dict[int, LanguageModel] = {}

    def visit(obj: object, depth: int) -> None:
        if isinstance(obj, LanguageModel):
            found[id(obj)] = obj
        elif depth < 3:
            if isinstance(obj, (list, tuple)):
                for o in obj:
                    visit(o, depth + 1)
            elif isinstance(obj, dict):
                for o in obj.values():
                    visit(o, depth + 1)
            elif hasattr(obj, "__dict__") and not isinstance(obj, type):
                for o in vars(obj).values():
                    visit(o, depth + 1)

    visit(model, 0)
    return list(found.values())
