"""The lazy draw's check of one token, for :class:`~llamppl.models.HardConstraint`.

- :func:`split_costly` — which parts of ``cheap & costly`` a draw masks with and which it
  checks per token (:func:`is_split`);
- :class:`TokenCheck` — the check of one drawn token (end tokens by the complete check, the
  token budget, a time bound over one draw's checks) and :meth:`TokenCheck.exhaust`, the
  listing of every allowed token on the vocabulary's trie after a long run of rejections
  (:func:`costly_text_check`, :mod:`~llamppl.decoding.proposals.vocab_trie`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from llamppl.decoding.constraints.protocol import AllOf, Constraint
from llamppl.decoding.constraints.time_bound import CheckTimeout, current_bound
from llamppl.decoding.proposals.constrained_tokens import is_text_state
from llamppl.decoding.proposals.lazy import Exhaust
from llamppl.decoding.proposals.vocab_trie import TrieWalk, vocab_trie
from llamppl.lm.base import LanguageModel

SCAN_BOUNDS = 10  # one lazy draw's checks together may run this many check time bounds

__all__ = [
    "SCAN_BOUNDS",
    "TokenCheck",
    "costly_text_check",
    "is_split",
    "split_costly",
    "timed_out_scans",
]


def reasons(c: Constraint) -> bool:
    """Whether ``c`` (or a part of it) reasons about the token budget (overrides ``reachable``)."""
    parts = c.parts if isinstance(c, AllOf) else (c,)
    return any(type(p).reachable is not Constraint.reachable for p in parts)


def is_split(c: Constraint) -> bool:
    """Whether a lazy draw masks with some parts of ``c`` and checks the others per token."""
    return isinstance(c, AllOf) and bool(c.cheap_parts) and bool(c.costly_parts)


def split_costly(
    lm: LanguageModel, c: Constraint
) -> tuple[tuple[int, ...] | None, Callable[[Any, int], bool]]:
    """For a lazy draw: the cheap parts of ``c`` to mask with (None: none) and the check of
    the others on one token (``allows(state, w)``)."""
    if is_split(c):
        costly = c.costly_parts

        def allows(state: Any, w: int) -> bool:
            return all(c.parts[i].allows(lm, state[i], w) for i in costly)

        return c.cheap_parts, allows
    return None, lambda state, w: c.allows(lm, state, w)


def costly_text_check(
    lm: LanguageModel, c: Constraint, state: Any, sound: bool = True
) -> Callable[[str], bool] | None:
    """The text check (:meth:`~llamppl.decoding.constraints.protocol.Constraint.text_check`) of the parts
    :func:`split_costly` leaves to per-token checks, or None when one of them has none, or
    (``sound`` false) is not closed under prefixes (:func:`~llamppl.decoding.constraints.protocol.
    sound_listings`)."""
    parts = [(c, state)]
    if isinstance(c, AllOf):
        costly = c.costly_parts if is_split(c) else range(len(c.parts))
        parts = [(c.parts[i], state[i]) for i in costly]
    checks = [p.text_check(lm, s) if (sound or p.prefix_closed) else None for p, s in parts]
    if not checks or any(f is None for f in checks):
        return None
    if len(checks) == 1:
        return checks[0]
    return lambda x: all(f(x) for f in checks)  # type: ignore[misc]


def timed_out_scans(c: Constraint, lm: LanguageModel) -> set:
    """The keys of the scans of ``c`` under ``lm`` that ran out of time (:class:`TokenCheck`),
    kept on the constraint per LM (a weak reference: a dropped LM takes its entries along)."""
    per_lm = c.__dict__.get("_timed_out_scans")
    if per_lm is None:
        per_lm = c.__dict__["_timed_out_scans"] = weakref.WeakKeyDictionary()
    return per_lm.setdefault(lm, set())


class TokenCheck:
    """The lazy draw's check of one token after ``state`` (``check(w)``): an end token iff
    the complete check passes (asked once), no other token when ``only_end``, else
    ``costly_allows`` (:func:`split_costly`'s check of the parts not masked) and, with
    ``left`` tokens in the budget, reachability in the ``left - 1`` after it. ``counted()``
    is called once per check made. :meth:`exhaust` lists every allowed token at once when
    the constraint has a text check (``text_check``, :func:`costly_text_check`).

    The checks of one draw together run under ``SCAN_BOUNDS`` times the current check
    bound (:func:`~llamppl.decoding.constraints.time_bound.current_bound`): a prefix check that admits
    a text no token can extend makes the draw scan the whole vocabulary, which for a
    check of milliseconds takes minutes; past the bound :class:`CheckTimeout` ends the
    particle (the one approximation, as for a single check that overruns). The time-out is
    kept, per constraint and LM, under everything the scan depended on (the context's tokens,
    which fix the row scanned; the text; the tokens left; the end rule; the bound), so the
    particle's clones from resampling end at once instead of scanning again, and no other
    prompt, LM or bound inherits it. It is never taken as a verdict on the text.

    ``sound`` (default True) lets a check that is sound but not closed under prefixes list
    on the trie (:func:`~llamppl.decoding.constraints.protocol.sound_listings`); ``context`` is the
    particle's token ids (prompt and generated)."""

    def __init__(
        self,
        constraint: Constraint,
        lm: LanguageModel,
        state: Any,
        costly_allows: Callable[[Any, int], bool],
        end_ids: Sequence[int],
        *,
        only_end: bool,
        left: int | None,
        counted: Callable[[], None],
        sound: bool = True,
        context: Sequence[int] = (),
    ) -> None:
        self.constraint, self.lm, self.state = constraint, lm, state
        self.costly_allows, self.end_ids, self.ends = costly_allows, tuple(end_ids), set(end_ids)
        self.only_end, self.left, self.counted = only_end, left, counted
        self.text_check = costly_text_check(lm, constraint, state, sound)
        self.walk: TrieWalk | None = None  # the listing of exhaust, resumed across calls
        self.row: torch.Tensor | None = None  # the draw's masked log-probs (exhauster)
        self.rejected: set[int] = set()  # tokens this draw's checks rejected
        self.todo: list[int] | None = None  # listed tokens whose budget is still to check
        self.kept: list[int] = []  # listed tokens within the budget
        self.end_ok: list[bool] = []
        self.bound, self.spent = current_bound(), 0.0  # seconds spent in this draw's checks
        self.timed_out = timed_out_scans(constraint, lm)
        scan = (tuple(context), state, left, only_end, self.end_ids, self.bound)
        self.key = scan if is_text_state(state) else None

    def _check(self, w: int) -> bool:
        c, lm, state = self.constraint, self.lm, self.state
        if w in self.ends:
            if not self.end_ok:
                self.counted()
                self.end_ok.append(c.ends(lm, state))
            return self.end_ok[0]
        if self.only_end:
            return False
        self.counted()
        ok = self.costly_allows(state, w) and self._reachable(w)
        if not ok:
            self.rejected.add(w)  # known outside A: the listing need not ask again
        return ok

    def _reachable(self, w: int) -> bool:
        c, state, left = self.constraint, self.state, self.left
        if left is None or not is_text_state(state):  # only text states advance purely
            return True
        return c.reachable(self.lm, c.advance(self.lm, state, w), left - 1)

    def _timed(self, check: Callable[[Any], bool], arg: Any) -> bool:
        bound = self.bound
        if bound is None:
            return check(arg)
        if self.spent > SCAN_BOUNDS * bound or (
            self.key is not None and self.key in self.timed_out
        ):
            if self.key is not None:
                self.timed_out.add(self.key)
            raise CheckTimeout(
                f"check timed out (one draw's checks ran over {SCAN_BOUNDS * bound:g} s)"
            )
        start = time.monotonic()
        try:
            return check(arg)
        finally:
            self.spent += time.monotonic() - start

    def __call__(self, w: int) -> bool:
        return self._timed(self._check, w)

    def exhauster(
        self,
        exclude: set[int] = frozenset(),  # type: ignore[assignment]
        row: torch.Tensor | None = None,
    ) -> Exhaust | None:
        """:meth:`exhaust` without the tokens ``exclude`` (hints already drawn from), or None
        when the constraint has no text check or only end tokens may come. With ``row`` (the
        draw's ``(V,)`` log-probs after the cheap mask) the listing skips the trie's subtrees
        whose tokens all have probability 0 (:meth:`~llamppl.decoding.proposals.vocab_trie.VocabTrie.live`)."""
        if self.text_check is None or self.only_end:
            return None
        self.row = row

        def exhaust(budget: int) -> tuple[list[int] | None, int]:
            found, checks = self.exhaust(budget)
            return (None if found is None else [w for w in found if w not in exclude]), checks

        return exhaust

    def exhaust(self, budget: int) -> tuple[list[int] | None, int]:
        """``(A, checks)``: every allowed token (end tokens included), listed with the text
        check on the vocabulary's trie (:class:`~llamppl.decoding.proposals.vocab_trie.TrieWalk`), then
        the budget check of each listed token (``reachable``), continuing the work of earlier
        calls for at most ``budget`` more checks; ``(None, checks)`` while it is unfinished."""
        text_check = self.text_check
        assert text_check is not None, "exhaust needs a text check (see exhauster)"
        if self.walk is None:

            def node(x: str) -> bool:
                self.counted()
                return self._timed(text_check, x)

            trie = vocab_trie(self.lm, self.end_ids)
            live = None if self.row is None else trie.live(torch.isfinite(self.row))
            self.walk = TrieWalk(trie, node, live)
        before = self.walk.checks
        found = self.walk.run(budget)
        checks = self.walk.checks - before
        if found is None:
            return None, checks
        if self.todo is None:  # the walk is done: the budget of the tokens it listed is next
            if self.row is not None:  # probability 0 does not count (one host read, rarely)
                positive = set(torch.isfinite(self.row).nonzero().flatten().tolist())
                found = [w for w in found if w in positive]
            self.todo = [w for w in reversed(found) if w not in self.rejected]
        # a budget check costs an analysis like a text check, so it spends the same budget (the
        # listing makes no more checks than the scan beside it); free when nothing is budgeted
        budgeted = self.left is not None and is_text_state(self.state) and reasons(self.constraint)
        while self.todo and not (budgeted and checks >= budget):
            w = self.todo.pop()
            checks += budgeted
            if not budgeted or self._timed(self._check, w):  # the scan's check of w
                self.kept.append(w)
        if self.todo:
            return None, checks
        found = self.kept + (list(self.end_ids) if self.end_ids and self(self.end_ids[0]) else [])
        return found, checks + 1
