"""Memo tables of the LM floor: values built once per language model, and bounded LRU memos.

Masks, token statistics, grammar tokenizers and batchers are computed from an
LM's vocabulary once and reused. Every such table is kept ON THE LM (in
``lm.memo``, a weak-keyed dictionary), keyed by the :class:`PerLM` object that
builds it, so a table lives exactly as long as both its LM and its owner: a
table that refers back to its LM (``VocabMasks``, a mask batcher) does not
keep the LM alive, and a constraint's private table goes with the constraint::

    stripped = PerLM(lambda lm: torch.tensor([len(t.strip()) for t in lm.vocab]))
    stripped(lm)                 # built on first use, then the same tensor
    lm_table(lm, "not_eos", build)   # the same, with a module-wide key

:class:`LRU` is the bounded recency memo both Hugging Face tokenizer backends
keep their next-token log-prob vectors in (and constraints their masks).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

__all__ = ["LRU", "PerLM", "lm_memo", "lm_table"]

K = TypeVar("K")
V = TypeVar("V")


def lm_memo(lm: Any) -> weakref.WeakKeyDictionary:
    """The memo store of ``lm``: ``{PerLM owner: value}``, created on first use."""
    store = vars(lm).get("memo")
    if store is None:
        store = vars(lm)["memo"] = weakref.WeakKeyDictionary()
    return store


class PerLM(Generic[V]):
    """``build(lm)``, computed once per LM and stored on it while this object lives.

    Copies (``copy.deepcopy`` of a particle holding it) share the one table.
    """

    def __init__(self, build: Callable[[Any], V]) -> None:
        if not callable(build):
            raise TypeError(f"build must be callable, got {type(build).__name__}")
        self.build = build

    def __call__(self, lm: Any) -> V:
        store = lm_memo(lm)
        try:
            return store[self]
        except KeyError:
            value = store[self] = self.build(lm)
            return value

    def __deepcopy__(self, memo: dict) -> PerLM[V]:
        return self


_BY_KEY: dict[Hashable, PerLM] = {}


def lm_table(lm: Any, key: Hashable, build: Callable[[Any], Any]) -> Any:
    """``build(lm)``, computed once per (LM, ``key``) and kept while the LM lives.

    ``key`` names the table module-wide (the first ``build`` given for a key is the one used).
    """
    table = _BY_KEY.get(key)
    if table is None:
        table = _BY_KEY[key] = PerLM(build)
    return table(lm)


class LRU(Generic[K, V]):
    """A memo of at most ``capacity`` entries; the least recently used goes first (0: keep none)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value stored under ``key`` (now the most recent), or None."""
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Store ``value`` as the most recent entry, dropping the oldest beyond ``capacity``."""
        if self.capacity <= 0:
            return
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def pop(self, key: K) -> V | None:
        """Drop the entry under ``key`` and return its value (None if there was none)."""
        return self._data.pop(key, None)

    def clear(self) -> None:
        """Drop every entry."""
        self._data.clear()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data
