"""Shared parts of the text-structure constraints (:mod:`~llamppl.decoding.text.builders`).

:class:`Bounds` (COLLIE's ``==``/``>=``/``<=`` relations as an integer range),
:class:`TextConstraint` (the base of every text constraint a builder returns: its plain
characters flag, target strings and unit levels, its automaton, and the hook that adds one
:class:`~llamppl.decoding.text.plain.PlainCharacters` part to a conjunction, :func:`plain_of`,
and with it the joint check of :mod:`~llamppl.decoding.text.feasible`, :func:`shape_of`),
:class:`TextStructure` (a text constraint decided from an analysis of the prefix,
:mod:`~llamppl.decoding.text.prefix`), target normalisation as COLLIE compares units
(lower-cased, punctuation stripped at both ends) and the token-budget arithmetic for
target words that must still be written (:mod:`~llamppl.decoding.text.budget`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from llamppl.decoding.constraints.protocol import AllOf, Constraint
from llamppl.decoding.text import units as tu
from llamppl.decoding.text.automata import Automaton
from llamppl.decoding.text.feasible import ShapeFit, strict
from llamppl.decoding.text.paragraphs import analyze_paragraphs
from llamppl.decoding.text.plain import PlainCharacters, plain_for
from llamppl.decoding.text.prefix import Analysis, analyze
from llamppl.decoding.text.spelling import Spelling, find_spelled, overlap_need, progress_mask
from llamppl.lm.base import LanguageModel
from llamppl.validation import is_integer

__all__ = [
    "Bounds",
    "TextConstraint",
    "TextStructure",
    "plain_flag",
    "plain_of",
    "shape_of",
    "with_implied",
    "target_key",
    "target_keys",
    "check_level",
    "norm_unit",
    "unit_at",
    "count_nonspace",
    "count_marks",
    "word_need",
    "last_word_need",
    "in_order_needs",
    "spelled_budget",
]


# ---------------------------------------------------------------------- shared parts
class Bounds:
    """An integer range ``lo <= n <= hi`` (either end may be None), from COLLIE's relations."""

    __slots__ = ("lo", "hi")

    def __init__(
        self, exactly: int | None = None, at_least: int | None = None, at_most: int | None = None
    ) -> None:
        for name, v in (("exactly", exactly), ("at_least", at_least), ("at_most", at_most)):
            if v is not None and (not is_integer(v) or v < 0):
                raise ValueError(f"{name} must be a non-negative integer or None, got {v!r}")
        if exactly is not None and (at_least is not None or at_most is not None):
            raise ValueError("give exactly, or at_least and/or at_most, not both")
        self.lo = exactly if exactly is not None else at_least
        self.hi = exactly if exactly is not None else at_most
        if self.lo is None and self.hi is None:
            raise ValueError("give at least one of exactly, at_least, at_most")
        if self.lo is not None and self.hi is not None and self.lo > self.hi:
            raise ValueError(f"at_least ({self.lo}) must not exceed at_most ({self.hi})")

    def ok(self, n: int) -> bool:
        return (self.lo is None or n >= self.lo) and (self.hi is None or n <= self.hi)

    def over(self, n: int) -> bool:
        """``n`` units that can only grow are too many already."""
        return self.hi is not None and n > self.hi

    def __repr__(self) -> str:
        if self.lo == self.hi:
            return f"exactly={self.lo}"
        parts = [f"at_least={self.lo}"] if self.lo is not None else []
        return ", ".join(parts + ([f"at_most={self.hi}"] if self.hi is not None else []))


def target_key(value: object, name: str) -> str:
    """One target as COLLIE compares it (:func:`~llamppl.decoding.text.units.normalize`);
    ``name`` names the argument in the error for a value that is not a non-empty str."""
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be non-empty strings, got {value!r}")
    return tu.normalize(value)


def target_keys(values: object, name: str) -> tuple[str, ...]:
    """A non-empty list of targets, each as :func:`target_key` gives it."""
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise TypeError(f"{name} must be a non-empty list of strings, got {values!r}")
    return tuple(target_key(v, name) for v in values)


def check_level(name: str, value: object, allowed: Sequence[str]) -> str:
    """``value`` if it is one of the ``allowed`` unit levels, else a ValueError naming ``name``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")
    return value  # type: ignore[return-value]


def norm_unit(unit: str | None) -> str | None:
    """A unit as COLLIE compares it, None staying None (a position out of range)."""
    return None if unit is None else tu.normalize(unit)


def unit_at(units: Sequence[str], index: int) -> str | None:
    """COLLIE's ``Position.get``: the unit at ``index`` or None out of range."""
    return units[index] if -len(units) <= index < len(units) else None


def count_nonspace(text: str) -> int:
    """Non-whitespace characters of ``text`` (an upper bound on the words it can hold)."""
    return sum(not ch.isspace() for ch in text)


def count_marks(text: str) -> int:
    """``.``, ``?`` and ``!`` in ``text`` (an upper bound on the sentence breaks it holds)."""
    return text.count(".") + text.count("?") + text.count("!")


def word_need(sp: Spelling, view: Analysis, region_lower: str, present: set[str]) -> int:
    """Tokens still needed before the word ``sp.target`` is a judge word of the open region
    (the last word of the open sentence, for a mark spelling; ``present``: certain words)."""
    target = sp.target
    if target in present:
        return 0
    if not view.exact:  # marks or quotes ahead: 0 if it may stand there already
        return overlap_need(sp, region_lower)
    word = view.open_word
    if word is not None:
        low = word.letters.lower()
        if target.startswith(low):
            return min(sp.fresh, sp.after[len(low)])
        if any(tu.normalize(w) == target for w in word.shorter_forms()):
            return 0
    return sp.fresh


def last_word_need(sp: Spelling, view: Analysis, region_lower: str) -> int:
    """Tokens still needed before the word ``sp.target`` is the text's last judge word: in an
    exact analysis, finishing the word being written as the target (or writing it anew) or 0
    when the last certain word is already the target (a text ending in whitespace); else 0
    when some certain word is the target or the open region may hold it already
    (:func:`~llamppl.decoding.text.spelling.overlap_need`). A sound lower bound: a text whose
    last word is the target has it written somewhere."""
    if not view.exact:
        if any(tu.normalize(w) == sp.target for w in view.flat + view.open_flat):
            return 0
        return overlap_need(sp, region_lower)
    if view.open_word is not None:
        return word_need(sp, view, region_lower, set())
    last = (view.flat + view.open_flat)[-1:]
    return 0 if last and tu.normalize(last[0]) == sp.target else sp.fresh


def in_order_needs(spelled: Sequence[Spelling], text_lower: str) -> list[int]:
    """Needs of targets that must come in this order: the first ones found one after the
    other need nothing, the next may be under way at the end, the rest are written anew."""
    needs, pos = [], 0
    for k, sp in enumerate(spelled):
        end = find_spelled(sp, text_lower, pos)
        if end is None:
            needs.append(overlap_need(sp, text_lower, pos))
            needs += [later.fresh for later in spelled[k + 1 :]]
            break
        needs.append(0)
        pos = end
    return needs


def spelled_budget(
    lm: LanguageModel,
    spelled: Sequence[Spelling],
    needs: Sequence[int],
    text_lower: str,
    tokens_left: int,
    extra: int = 0,
    add: bool = True,
    total: int | None = None,
) -> tuple[bool, torch.Tensor | None]:
    """Reachability and budget mask of "every spelling still to write" (sum or maximum, or
    ``total`` when the caller combined the needs itself).

    Returns ``(reachable, mask)``: ``mask`` is None while the budget leaves a token to spare,
    else the tokens that write more of some target (and the end tokens).
    """
    if total is None:
        total = (sum(needs) + extra) if add else max([0, *needs])
    if total > tokens_left:
        return False, None
    if total < tokens_left:
        return True, None
    mask = torch.zeros(lm.vocab_size, dtype=torch.bool, device=lm.device)
    for sp, need in zip(spelled, needs):
        if need:
            mask |= progress_mask(lm, sp, text_lower)
    mask[list(lm.eos_token_ids)] = True
    return True, mask


def plain_flag(value: object) -> bool:
    """``value`` if it is a bool (the builders' ``plain=``), else a TypeError naming ``plain``."""
    if not isinstance(value, bool):
        raise TypeError(f"plain must be a bool, got {type(value).__name__}")
    return value


class TextConstraint(Constraint):
    """Base class of the text constraints the builders return.

    ``plain`` (set by the builders, default True there) asks for plain characters: in any
    conjunction this constraint ends up in (a lone builder is a conjunction of one, see
    :func:`with_implied`), the first plain text constraint's :meth:`implied` adds the one
    :class:`~llamppl.decoding.text.plain.PlainCharacters` part that :func:`plain_of` derives from
    all of them, and the target includes it. Subclasses name what the derivation reads:
    :meth:`target_strings` (characters to allow), :meth:`levels` (paragraphs allow
    newlines) and :meth:`run_floor` (runs to allow); ``on_characters`` marks a constraint on
    characters alone (no word split, so only the character set applies). When those plain
    characters are strict, the same hook adds the joint check of every text constraint that
    has an :meth:`automaton` (:func:`shape_of`).
    """

    plain: bool = False
    on_characters: bool = False

    def target_strings(self) -> tuple[str, ...]:
        """The constraint's target strings as given (none by default)."""
        return ()

    def levels(self) -> frozenset[str]:
        """The unit levels the constraint reads (``"word"``, ``"paragraph"``, ...)."""
        return frozenset()

    def run_floor(self) -> int:
        """The longest run of characters between spaces a text must be able to hold (the
        shortest word ``chars_per_word`` allows; 0 by default)."""
        return 0

    def automaton(self) -> Automaton | None:
        """The constraint as an automaton on a plain text's units
        (:mod:`~llamppl.decoding.text.automata`), for the joint prefix check
        (:class:`~llamppl.decoding.text.feasible.ShapeFit`); None when it has none."""
        return None

    def implied(self, parts: Sequence[Constraint]) -> list[Constraint]:
        """The conjunction's plain characters and, when they are strict, its joint prefix check
        (:func:`shape_of`), from its first plain text constraint (others: none); subclasses
        add what they imply with the other parts."""
        first = next((p for p in parts if isinstance(p, TextConstraint) and p.plain), None)
        if first is not self:
            return []
        plain = plain_of(parts)
        fit = shape_of(parts, plain)
        return [plain] if fit is None else [plain, fit]

    def plain_repr(self) -> str:
        """``", plain=False"`` when the constraint asks for no plain characters, else ``""``."""
        return "" if self.plain else ", plain=False"


def plain_of(parts: Sequence[Constraint]) -> PlainCharacters:
    """The :class:`~llamppl.decoding.text.plain.PlainCharacters` of a conjunction's text
    constraints (:func:`~llamppl.decoding.text.plain.plain_for`): every target string's
    characters, newlines where some constraint reads paragraphs, the character set alone
    where some constraint is on characters."""
    texts = [p for p in parts if isinstance(p, TextConstraint)]
    levels = frozenset().union(*(p.levels() for p in texts))
    return plain_for(
        [s for p in texts for s in p.target_strings()],
        paragraphs="paragraph" in levels,
        characters=any(p.on_characters for p in texts),
        run_floor=max([0, *(p.run_floor() for p in texts)]),
    )


def shape_of(parts: Sequence[Constraint], plain: PlainCharacters) -> ShapeFit | None:
    """The joint prefix check of a conjunction's text constraints under ``plain``
    (:class:`~llamppl.decoding.text.feasible.ShapeFit`): every text constraint that is an
    automaton (:meth:`TextConstraint.automaton`), when ``plain`` is strict
    (:func:`~llamppl.decoding.text.feasible.strict`); None otherwise."""
    if not strict(plain):
        return None
    read = [(p, p.automaton()) for p in parts if isinstance(p, TextConstraint)]
    read = [(p, a) for p, a in read if a is not None]
    if not read:
        return None
    return ShapeFit([a for _, a in read], plain, [p for p, _ in read])


def with_implied(part: Constraint) -> Constraint:
    """``part`` as a conjunction of one when it implies something alone (its plain characters),
    else ``part`` itself: what a builder returns."""
    if part.implied([part]):
        return AllOf(part)
    return part


class TextStructure(TextConstraint):
    """Base class: a text constraint decided from an analysis of the prefix.

    Subclasses set ``view`` (``"sentence"``: :func:`~llamppl.decoding.text.prefix.analyze`,
    ``"paragraph"``: :func:`~llamppl.decoding.text.prefix.analyze_paragraphs`) and
    implement ``prefix_ok(text, view)`` and ``accepts_end(text)``.
    """

    view = "sentence"

    def view_of(self, text: str, parent: str | None = None) -> Any:
        """The prefix analysis of ``text`` this constraint reads (``parent``: a shorter prefix
        already analysed, only for speed)."""
        if self.view == "paragraph":
            return analyze_paragraphs(text, parent)
        return analyze(text, parent)

    def __call__(self, text: str) -> bool:
        return self.prefix_ok(text, self.view_of(text))

    def prefix_ok(self, text: str, view: Any) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def allows(self, lm: LanguageModel, state: Any, token: int) -> bool:
        """The memoised prefix check of ``state + token``, its analysis started from ``state``'s."""
        return self._after(state, state + lm.vocab[token])

    def text_check(self, lm: LanguageModel, state: Any) -> Callable[[str], bool] | None:
        """The memoised prefix check of ``state + x`` for any string ``x``, as :meth:`allows`
        (the trie listing of :mod:`~llamppl.decoding.proposals.vocab_trie`). It rejects a text only
        when no completion of it can pass (sound; not always closed under prefixes: the
        listing then leaves out only dead tokens, see that module; ``prefix_closed`` stays
        False, so a program that keeps cut texts unchecked does not list)."""
        if not isinstance(state, str):
            return None
        return lambda x: self._after(state, state + x)

    def _after(self, state: str, text: str) -> bool:
        """``checked(False, text)`` with the analysis of ``text`` started from ``state``'s (a
        prefix of it): a lookup when it is known, else far cheaper than from the start, and
        ``reachable`` then finds it analysed."""
        self.view_of(text, state)
        return self.checked(False, text)
