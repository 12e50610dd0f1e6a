r"""Constraints on the words, sentences and paragraphs of a text, exact on prefixes.

COLLIE (Yao et al., 2023) states constraints on a text's units — its characters, NLTK's
words and sentences, the paragraphs between blank lines — and grades with NLTK. These
constraints read the same units (:mod:`~llamppl.decoding.text_units`) and answer the
constraint protocol's questions (:mod:`~llamppl.decoding.constraints`) so that
:class:`~llamppl.models.HardConstraint` can condition a language model on them:

``c(text)`` — can the prefix still be completed into a text the judge accepts?
    Sound: never False for a prefix some continuation completes. As tight as what is
    *certain* about the prefix allows (:mod:`~llamppl.decoding.text_prefix`): a sentence
    or word that no continuation can change is checked at once, and so is the word being
    written (``"A b c Sure"`` is dead for "the 4th word is 'jaw'"). A unit that is not
    certain yet is checked a chunk or two later.
``c.accepts_end(text)`` — the judge's own verdict on the finished text.
``c.reachable(lm, text, tokens_left)`` — False when no completion of at most
    ``tokens_left`` more tokens can pass. Each builder's docstring says how the budget
    enters; the bounds use facts of ``lm``'s vocabulary (:mod:`~llamppl.decoding.text_budget`).
``c.allowed_mask(lm, text)`` — only for the character constraints (:func:`char_count`,
    :func:`chars_at`): a batched ``(V,)`` mask from per-LM tables. The others are checked
    lazily on the tokens a draw visits, in microseconds while the text is plain words and
    spaces (no NLTK call), in a millisecond or two around marks and quotes.

Builders (``exactly``/``at_least``/``at_most`` are COLLIE's ``==``/``>=``/``<=``)::

    char_count(exactly=82)                        # c04: a text of exactly 82 characters
    chars_at({3: "o", 7: "s", 10: "r"})           # c02: the 4th, 8th, 11th characters
    word_count(exactly=17) & words_at({3: "she", 7: "a", 10: "his"})           # c05
    word_count(at_least=31) & chars_per_word(at_most=7)                         # c06a
    contains_words(["not", "was", "now"])                                       # c07
    first_word_of_sentences("He")                                               # c08
    sentence_count(exactly=6) & excludes_words(["there", "of", "is"])           # c09
    sentence_count(exactly=5) & words_per_sentence(at_least=10, at_most=16)     # c10
    last_word_of_sentences(["sympathy", "republicanism", "type"])               # c12
    last_sentence_of_paragraphs([s1, s2, s3], min_sentences=2)                  # c14

Compose them with ``&``. Targets compare as COLLIE compares them: lower-cased, stripped of
punctuation at both ends (``"Peninsula."`` is ``"peninsula"``). A list of per-unit targets
fixes the number of units, as COLLIE's reduction does. Every check is a pure function of the
text, memoised, and needs the ``collie`` extra (NLTK).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from llamppl.lm.base import LanguageModel

from . import text_units as tu
from .constraints import Constraint
from .text_budget import (
    Spelling,
    can_share,
    char_codes,
    char_key,
    find_spelled,
    ids_mask,
    layout_facts,
    max_token_chars,
    overlap_need,
    progress_mask,
    spelling,
    token_lengths,
    unit_growth,
)
from .text_prefix import Analysis, Paragraphs, analyze, analyze_paragraphs

__all__ = [
    "Bounds",
    "CharCount",
    "CharsAt",
    "UnitCount",
    "UnitsAt",
    "EachCount",
    "EachAt",
    "WordsIncluded",
    "WordsExcluded",
    "char_count",
    "word_count",
    "sentence_count",
    "paragraph_count",
    "chars_at",
    "words_at",
    "chars_per_word",
    "words_per_sentence",
    "sentences_per_paragraph",
    "first_word_of_sentences",
    "last_word_of_sentences",
    "last_sentence_of_paragraphs",
    "contains_words",
    "excludes_words",
]


# ---------------------------------------------------------------------- shared parts
class Bounds:
    """An integer range ``lo <= n <= hi`` (either end may be None), from COLLIE's relations."""

    __slots__ = ("lo", "hi")

    def __init__(
        self, exactly: int | None = None, at_least: int | None = None, at_most: int | None = None
    ) -> None:
        for name, v in (("exactly", exactly), ("at_least", at_least), ("at_most", at_most)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
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


def _target(value: object, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be non-empty strings, got {value!r}")
    return tu.normalize(value)


def _targets(values: object, name: str) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise TypeError(f"{name} must be a non-empty list of strings, got {values!r}")
    return tuple(_target(v, name) for v in values)


def _level(name: str, value: object, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")
    return value  # type: ignore[return-value]


def _norm(unit: str | None) -> str | None:
    return None if unit is None else tu.normalize(unit)


def _at(units: Sequence[str], index: int) -> str | None:
    """COLLIE's ``Position.get``: the unit at ``index`` or None out of range."""
    return units[index] if -len(units) <= index < len(units) else None


def _nonspace(text: str) -> int:
    return sum(not ch.isspace() for ch in text)


def _marks(text: str) -> int:
    return text.count(".") + text.count("?") + text.count("!")


def _word_need(sp: Spelling, view: Analysis, region_lower: str, present: set[str]) -> int:
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


def _in_order(spelled: Sequence[Spelling], text_lower: str) -> list[int]:
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


def _spelled_budget(
    lm: LanguageModel,
    spelled: Sequence[Spelling],
    needs: Sequence[int],
    text_lower: str,
    tokens_left: int,
    extra: int = 0,
    add: bool = True,
) -> tuple[bool, torch.Tensor | None]:
    """Reachability and budget mask of "every spelling still to write" (sum or maximum).

    Returns ``(reachable, mask)``: ``mask`` is None while the budget leaves a token to spare,
    else the tokens that write more of some target (and the end tokens).
    """
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


class TextStructure(Constraint):
    """Base class: a constraint decided from an analysis of the prefix.

    Subclasses set ``view`` (``"sentence"``: :func:`~llamppl.decoding.text_prefix.analyze`,
    ``"paragraph"``: :func:`~llamppl.decoding.text_prefix.analyze_paragraphs`) and
    implement ``prefix_ok(text, view)`` and ``accepts_end(text)``.
    """

    view = "sentence"

    def _view(self, text: str, parent: str | None = None) -> Any:
        if self.view == "paragraph":
            return analyze_paragraphs(text, parent)
        return analyze(text, parent)

    def __call__(self, text: str) -> bool:
        return self.prefix_ok(text, self._view(text))

    def prefix_ok(self, text: str, view: Any) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def allows(self, lm: LanguageModel, state: Any, token: int) -> bool:
        """The memoised prefix check of ``state + token``, its analysis started from ``state``'s."""
        self._view(state + lm.vocab[token], state)
        return super().allows(lm, state, token)


# ---------------------------------------------------------------------- characters
class CharCount(Constraint):
    """The number of characters (``len(text)``, whitespace included) within :class:`Bounds`.

    Prefix check: ``len(text) <= at_most``. Mask: ``len(text) + len(token) <= at_most``
    from a per-LM table of token lengths. Budget: at least ``at_least - len(text)``
    characters must come, and a token adds at most ``max_token_chars(lm)`` of them.
    """

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds

    def __call__(self, text: str) -> bool:
        return not self.bounds.over(len(text))

    def accepts_end(self, text: str) -> bool:
        return self.bounds.ok(len(text))

    def allowed_mask(self, lm: LanguageModel, text: str) -> torch.Tensor:
        n = len(text)
        mask = torch.ones(lm.vocab_size, dtype=torch.bool, device=lm.device)
        if self.bounds.hi is not None:
            mask = token_lengths(lm) + n <= self.bounds.hi
        mask[list(lm.eos_token_ids)] = self.accepts_end(text)
        return mask

    def reachable(self, lm: LanguageModel, state: str, tokens_left: int) -> bool:
        need = 0 if self.bounds.lo is None else self.bounds.lo - len(state)
        return need <= tokens_left * max_token_chars(lm)

    def budget_mask(self, lm: LanguageModel, state: str, tokens_left: int) -> torch.Tensor | None:
        if self.bounds.lo is None:
            return None
        shortest = self.bounds.lo - len(state) - (tokens_left - 1) * max_token_chars(lm)
        if shortest <= 0:
            return None
        mask = token_lengths(lm) >= shortest
        mask[list(lm.eos_token_ids)] = True
        return mask

    def __repr__(self) -> str:
        return f"char_count({self.bounds!r})"


class CharsAt(Constraint):
    """Given characters at given positions (COLLIE's ``Position`` on characters, ``==``).

    A character compares as COLLIE compares it: lower-cased, and a space or ``.`` is the
    empty unit, which no letter equals. Positions ``>= 0`` are checked as soon as the text
    reaches them (the mask reads each token's characters from a per-LM ``(V, L)`` table);
    negative positions count from the end and are checked only on the finished text.
    No budget of its own.
    """

    def __init__(self, positions: Mapping[int, str]) -> None:
        if not isinstance(positions, Mapping) or not positions:
            raise TypeError(
                f"positions must be a non-empty mapping index -> str, got {positions!r}"
            )
        for i, c in positions.items():
            if isinstance(i, bool) or not isinstance(i, int):
                raise TypeError(f"positions keys must be integers, got {i!r}")
            if not isinstance(c, str) or len(c) != 1:
                raise ValueError(f"positions values must be single characters, got {c!r}")
        self.raw_positions = dict(positions)
        self.positions = {i: char_key(c) for i, c in positions.items()}

    def _ok(self, text: str, end: bool) -> bool:
        for i, key in self.positions.items():
            if i >= len(text) or i < -len(text):
                if end:
                    return False
            elif (i >= 0 or end) and char_key(text[i]) != key:
                return False
        return True

    def __call__(self, text: str) -> bool:
        return self._ok(text, end=False)

    def accepts_end(self, text: str) -> bool:
        return self._ok(text, end=True)

    def allowed_mask(self, lm: LanguageModel, text: str) -> torch.Tensor:
        n = len(text)
        mask = torch.full((lm.vocab_size,), self(text), dtype=torch.bool, device=lm.device)
        codes, index = char_codes(lm)
        for i, key in self.positions.items():
            offset = i - n
            if 0 <= offset < codes.shape[1]:  # the position falls inside some tokens
                want = index.get(key, -2)
                mask &= (codes[:, offset] == want) | (codes[:, offset] < 0)
        mask[list(lm.eos_token_ids)] = self.accepts_end(text)
        return mask

    def __repr__(self) -> str:
        return f"chars_at({self.positions!r})"


# ---------------------------------------------------------------------- counts and positions
class UnitCount(TextStructure):
    """The number of words, sentences or paragraphs within :class:`Bounds`.

    Prefix check: the units certain to be there (certain words and the word being written;
    certain sentences plus one for any open text; every paragraph delimiter) do not exceed
    ``at_most``. Budget: ``at_least`` minus an upper bound of the units the text can still
    hold must be within ``tokens_left`` times the most units one token adds
    (:func:`~llamppl.decoding.text_budget.unit_growth`: judge words, marks, newlines).
    """

    def __init__(self, level: str, bounds: Bounds) -> None:
        self.level = _level("level", level, ("word", "sentence", "paragraph"))
        self.bounds = bounds
        self.view = "paragraph" if self.level == "paragraph" else "sentence"

    def _certain(self, view: Any) -> int:
        if self.level == "word":
            return view.certain_words
        if self.level == "sentence":
            return len(view.sentences) + view.content
        return len(view.final) + 1

    def prefix_ok(self, text: str, view: Any) -> bool:
        return not self.bounds.over(self._certain(view))

    def accepts_end(self, text: str) -> bool:
        return self.bounds.ok(len(tu.units(text, self.level)))

    def reachable(self, lm: LanguageModel, state: str, tokens_left: int) -> bool:
        if self.bounds.lo is None:
            return True
        view, grow = self._view(state), unit_growth(lm)
        if self.level == "word":
            upper = len(view.flat) + len(view.open_flat) + 2
            if not view.exact:
                upper = len(view.flat) + _nonspace(state[view.anchor :])
            per_token = grow.words
        elif self.level == "sentence":
            upper, per_token = len(view.sentences) + _marks(state[view.anchor :]) + 1, grow.marks
        else:
            upper, per_token = len(view.final) + 1, grow.newlines
        return self.bounds.lo - upper <= tokens_left * per_token

    def __repr__(self) -> str:
        return f"{self.level}_count({self.bounds!r})"


class UnitsAt(TextStructure):
    """Given words or sentences at given positions (COLLIE's ``Position``, ``==``).

    Prefix check: a certain unit at a position must equal its target, and so may the word
    being written (``"jaw"`` may still come from ``"ja"``, never from ``"Sure"``). Negative
    positions are checked only on the finished text. No budget of its own.
    """

    def __init__(self, level: str, positions: Mapping[int, str]) -> None:
        self.level = _level("level", level, ("word", "sentence"))
        if not isinstance(positions, Mapping) or not positions:
            raise TypeError(
                f"positions must be a non-empty mapping index -> str, got {positions!r}"
            )
        for i in positions:
            if isinstance(i, bool) or not isinstance(i, int):
                raise TypeError(f"positions keys must be integers, got {i!r}")
        self.positions = {i: _target(t, "positions values") for i, t in positions.items()}

    def prefix_ok(self, text: str, view: Any) -> bool:
        for i, target in self.positions.items():
            if i < 0:
                continue
            if self.level == "word":
                unit = view.word_at(i)
                if unit is None:
                    if view.open_word is not None and i == len(view.flat) + len(view.open_flat):
                        if not view.open_word.may_become(target):
                            return False
                    continue
            else:
                unit = view.sentences[i].text if i < len(view.sentences) else None
            if unit is not None and tu.normalize(unit) != target:
                return False
        return True

    def accepts_end(self, text: str) -> bool:
        units = tu.units(text, self.level)
        return all(_norm(_at(units, i)) == t for i, t in self.positions.items())

    def _budget(self, lm: LanguageModel, state: str, tokens_left: int):
        view = self._view(state)
        if self.level != "word":
            return True, None
        todo = {i: t for i, t in self.positions.items() if i >= 0 and view.word_at(i) is None}
        if not todo:
            return True, None
        add = not (can_share(lm, list(todo.values())) or layout_facts(lm).inner_space)
        here = state[view.anchor :].lower()
        at = len(view.flat) + len(view.open_flat)  # the index of the word being written
        spelled = [spelling(lm, todo[i], word=True) for i in sorted(todo)]
        if view.exact:  # only the word being written may be under way
            needs = [
                _word_need(sp, view, here, set()) if i == at else sp.fresh
                for i, sp in zip(sorted(todo), spelled)
            ]
        else:
            needs = _in_order(spelled, here)
        return _spelled_budget(lm, spelled, needs, here, tokens_left, add=add)

    def reachable(self, lm: LanguageModel, state: str, tokens_left: int) -> bool:
        """Every target word not yet certain needs its fewest spelling tokens (summed unless
        one token can hold two of them: :func:`~llamppl.decoding.text_budget.can_share`)."""
        return self._budget(lm, state, tokens_left)[0]

    def budget_mask(self, lm: LanguageModel, state: str, tokens_left: int) -> torch.Tensor | None:
        return self._budget(lm, state, tokens_left)[1]

    def __repr__(self) -> str:
        return f"units_at({self.level!r}, {self.positions!r})"


# ---------------------------------------------------------------------- per unit
_EACH_COUNT = (
    ("word", "character"),
    ("sentence", "word"),
    ("sentence", "character"),
    ("paragraph", "sentence"),
    ("paragraph", "word"),
)


class EachCount(TextStructure):
    """Every outer unit holds a number of inner units within :class:`Bounds` (COLLIE's
    ``InputLevel(outer)``, ``TargetLevel(inner)``, ``ForEach(Count())``, reduction ``all``).

    Prefix check: every certain outer unit complies; the open one (the word, sentence or
    paragraph being written) must not hold more than ``at_most`` certain inner units (the
    word being written is at least ``OpenWord.min_length()`` characters long). Budget: the
    open unit still needs ``at_least`` minus an upper bound of what it holds, at the most
    inner units one token adds (:func:`~llamppl.decoding.text_budget.unit_growth`).
    """

    def __init__(self, outer: str, inner: str, bounds: Bounds) -> None:
        if (outer, inner) not in _EACH_COUNT:
            raise ValueError(f"(outer, inner) must be one of {_EACH_COUNT}; got {(outer, inner)!r}")
        self.outer, self.inner, self.bounds = outer, inner, bounds
        self.view = "paragraph" if outer == "paragraph" else "sentence"

    def _finished(self, view: Any) -> list[int]:
        if self.outer == "word":
            return [len(w) for w in view.flat + view.open_flat]
        if self.outer == "sentence":
            return [len(s.words if self.inner == "word" else s.text) for s in view.sentences]
        return [len(u) for u in (view.final if self.inner == "sentence" else view.final_words)]

    def _open_lower(self, view: Any) -> int:
        if self.outer == "word":
            return 0 if view.open_word is None else view.open_word.min_length()
        if self.outer == "sentence":
            if self.inner == "character":
                return 0
            return len(view.open_nested) + (view.open_word is not None)
        a = view.open
        return len(a.sentences) + a.content if self.inner == "sentence" else a.certain_words

    def prefix_ok(self, text: str, view: Any) -> bool:
        if not all(self.bounds.ok(n) for n in self._finished(view)):
            return False
        return not self.bounds.over(self._open_lower(view))

    def accepts_end(self, text: str) -> bool:
        return all(self.bounds.ok(len(u)) for u in tu.nested_units(text, self.outer, self.inner))

    def reachable(self, lm: LanguageModel, state: str, tokens_left: int) -> bool:
        if self.bounds.lo is None or self.outer == "word" or self.inner == "character":
            return True
        view, grow = self._view(state), unit_growth(lm)
        if self.outer == "sentence":  # words the open sentence may hold at most
            a = view
            if not a.content:
                return True
            upper, per_token = len(a.open_nested) + _nonspace(state[a.anchor :]), grow.words
        else:
            a = view.open
            if not a.content:
                return True
            rest = view.open_text[a.anchor :]
            if self.inner == "sentence":
                upper, per_token = len(a.sentences) + _marks(rest) + 1, grow.marks
            else:
                upper, per_token = len(a.flat) + _nonspace(rest), grow.words
        return self.bounds.lo - upper <= tokens_left * per_token

    def __repr__(self) -> str:
        return f"each_count({self.outer!r}, {self.inner!r}, {self.bounds!r})"


class EachAt(TextStructure):
    """Every outer unit has a given inner unit at ``index`` (COLLIE's ``ForEach(Position(i))``,
    ``==``, reduction ``all``): the first word of each sentence, the last word of each
    sentence, the last sentence of each paragraph.

    ``targets`` is one string (for every outer unit, any number of them) or a list (one per
    outer unit, so there must be exactly ``len(targets)`` of them). With ``min_inner``,
    every outer unit must also hold at least that many inner units.

    Prefix check: every certain outer unit has its target (and, with a list, there are not
    more of them than targets); in the open sentence, a certain word at ``index >= 0`` or
    the word being written must fit. Budget (list targets, ``index == -1``): every target
    not yet written needs its fewest spelling tokens
    (:func:`~llamppl.decoding.text_budget.spelling`; a start already ending the text
    counts), summed over targets when the LM's tokens never straddle two sentences
    (:func:`~llamppl.decoding.text_budget.layout_facts`), else their maximum; for
    paragraphs with ``min_inner >= 2``, plus one token per free sentence each future
    paragraph needs and, when no token mixes newlines and text, one per paragraph delimiter.
    """

    def __init__(
        self,
        outer: str,
        inner: str,
        index: int,
        targets: str | Sequence[str],
        min_inner: int = 0,
    ) -> None:
        if (outer, inner) not in (("sentence", "word"), ("paragraph", "sentence")):
            raise ValueError(
                "(outer, inner) must be ('sentence', 'word') or ('paragraph', 'sentence'); "
                f"got {(outer, inner)!r}"
            )
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"index must be an integer, got {index!r}")
        if isinstance(min_inner, bool) or not isinstance(min_inner, int) or min_inner < 0:
            raise ValueError(f"min_inner must be a non-negative integer, got {min_inner!r}")
        self.outer, self.inner, self.index, self.min_inner = outer, inner, index, min_inner
        self.targets: str | tuple[str, ...] = (
            _target(targets, "targets")
            if isinstance(targets, str)
            else _targets(targets, "targets")
        )
        self.view = "paragraph" if outer == "paragraph" else "sentence"

    def _target(self, k: int) -> str | None:
        if isinstance(self.targets, str):
            return self.targets
        return self.targets[k] if k < len(self.targets) else None

    def _unit_ok(self, k: int, units: Sequence[str]) -> bool:
        target = self._target(k)
        if target is None or len(units) < self.min_inner:
            return False
        return _norm(_at(units, self.index)) == target

    def prefix_ok(self, text: str, view: Any) -> bool:
        if self.outer == "sentence":
            finished: list[Sequence[str]] = [s.words for s in view.sentences]
            open_text = view.content
        else:
            finished, open_text = list(view.final), True  # the open piece is a paragraph
        if not all(self._unit_ok(k, u) for k, u in enumerate(finished)):
            return False
        k = len(finished)
        if open_text and self._target(k) is None:
            return False
        if self.outer == "sentence" and self.index >= 0 and view.content:
            target, a = self._target(k), view
            if self.index < len(a.open_nested):
                return tu.normalize(a.open_nested[self.index]) == target
            if a.open_word is not None and self.index == len(a.open_nested):
                return a.open_word.may_become(target)
        if self.outer == "paragraph" and self.index >= 0:
            sentences = view.open.sentences
            if self.index < len(sentences):
                return tu.normalize(sentences[self.index].text) == self._target(k)
        return True

    def accepts_end(self, text: str) -> bool:
        units = tu.nested_units(text, self.outer, self.inner)
        if not isinstance(self.targets, str) and len(units) != len(self.targets):
            return False
        return all(self._unit_ok(k, u) for k, u in enumerate(units))

    def _budget(self, lm: LanguageModel, state: str, tokens_left: int):
        if isinstance(self.targets, str) or self.index != -1:
            return True, None
        view = self._view(state)
        separate = layout_facts(lm).separate_sentences
        last = len(self.targets) - 1
        if self.outer == "sentence":
            done, here = len(view.sentences), state[view.anchor :].lower()
            spelled = [
                spelling(lm, t, mark=done + k < last, word=True)
                for k, t in enumerate(self.targets[done:])
            ]
            if view.exact:  # no mark ahead: only the open sentence's last word may be under way
                needs = [_word_need(spelled[0], view, here, set())]
                needs += [sp.fresh for sp in spelled[1:]]
            else:  # the targets must stand in order, each before a mark
                needs = _in_order(spelled, here)
            return _spelled_budget(lm, spelled, needs, here, tokens_left, add=separate)
        done, here = len(view.final), view.open_text.lower()
        rest = self.targets[done:]
        if not rest:
            return True, None
        first = spelling(lm, rest[0])
        need_first = overlap_need(first, here)
        future = sum(spelling(lm, t).fresh for t in rest[1:])
        extra = self._paragraph_extra(lm, view, need_first, rest) + future
        ok, mask = _spelled_budget(
            lm, [first], [need_first], here, tokens_left, extra=extra, add=separate
        )
        if mask is not None:
            mask |= ids_mask(lm, "boundary")  # marks and delimiters are progress too
        return ok, mask

    def reachable(self, lm: LanguageModel, state: str, tokens_left: int) -> bool:
        return self._budget(lm, state, tokens_left)[0]

    def budget_mask(self, lm: LanguageModel, state: str, tokens_left: int) -> torch.Tensor | None:
        return self._budget(lm, state, tokens_left)[1]

    def _paragraph_extra(
        self, lm: LanguageModel, view: Paragraphs, first: int, rest: Sequence[str]
    ) -> int:
        """Tokens the paragraphs still need beyond their last sentences (class docstring)."""
        facts = layout_facts(lm)
        if not rest or not facts.separate_sentences:
            return 0
        free = max(0, self.min_inner - 1)  # sentences before the last one, per paragraph
        extra = (len(rest) - 1) * (free + (0 if facts.newline_with_text else 1))
        a: Analysis = view.open
        done = len(a.sentences)
        marks = _marks(view.open_text[a.anchor :])
        if not a.content or (marks == 0 and first == spelling(lm, rest[0]).fresh):
            # nothing open, or one unfinished sentence that is not the last one under way:
            # it needs a mark, in a token of its own, and the other free sentences follow
            return extra + max(0, free - done)
        return extra + max(0, free - done - marks - 1)

    def __repr__(self) -> str:
        return (
            f"each_at({self.outer!r}, {self.inner!r}, {self.index}, {self.targets!r}"
            f"{f', min_inner={self.min_inner}' if self.min_inner else ''})"
        )


# ---------------------------------------------------------------------- words present or absent
class WordsIncluded(TextStructure):
    """Every target word is among the text's words (COLLIE's ``in`` on words).

    Prefix check: always possible. Budget: each target not yet in the text (as a substring,
    case-insensitively) needs its fewest spelling tokens, a start of it ending the text
    counting (:func:`~llamppl.decoding.text_budget.overlap_need`); summed when no token of
    the LM can hold the end of one target and the start of another, else the maximum.
    """

    def __init__(self, words: Sequence[str]) -> None:
        self.words = _targets(words, "words")

    def prefix_ok(self, text: str, view: Analysis) -> bool:
        return True

    def __call__(self, text: str) -> bool:
        return True

    def accepts_end(self, text: str) -> bool:
        found = {tu.normalize(w) for w in tu.words(text)}
        return all(w in found for w in self.words)

    def _budget(self, lm: LanguageModel, state: str, tokens_left: int):
        view = self._view(state)
        present = {tu.normalize(w) for w in view.flat + view.open_flat}
        if all(w in present for w in self.words):
            return True, None
        add = not (can_share(lm, self.words) or layout_facts(lm).inner_space)
        here = state[view.anchor :].lower()
        spelled = [spelling(lm, w, word=True) for w in self.words]
        needs = [_word_need(sp, view, here, present) for sp in spelled]
        return _spelled_budget(lm, spelled, needs, here, tokens_left, add=add)

    def reachable(self, lm: LanguageModel, state: str, tokens_left: int) -> bool:
        return self._budget(lm, state, tokens_left)[0]

    def budget_mask(self, lm: LanguageModel, state: str, tokens_left: int) -> torch.Tensor | None:
        return self._budget(lm, state, tokens_left)[1]

    def __repr__(self) -> str:
        return f"contains_words({list(self.words)!r})"


class WordsExcluded(TextStructure):
    """No banned word is among the text's words (COLLIE's ``not in`` on words).

    Unlike :func:`~llamppl.decoding.text_constraints.banned_words` (runs of letters), the
    words are the judge's: ``isn't`` holds the word ``is``, ``is-a`` does not. Prefix check:
    no certain word is banned. No budget.
    """

    def __init__(self, words: Sequence[str]) -> None:
        self.words = frozenset(_targets(words, "words"))

    def prefix_ok(self, text: str, view: Analysis) -> bool:
        return not any(tu.normalize(w) in self.words for w in view.flat + view.open_flat)

    def accepts_end(self, text: str) -> bool:
        return not any(tu.normalize(w) in self.words for w in tu.words(text))

    def __repr__(self) -> str:
        return f"excludes_words({sorted(self.words)!r})"


# ---------------------------------------------------------------------- builders
def char_count(
    *, exactly: int | None = None, at_least: int | None = None, at_most: int | None = None
) -> CharCount:
    """The text has ``exactly`` / ``at_least`` / ``at_most`` characters (spaces included)."""
    return CharCount(Bounds(exactly, at_least, at_most))


def word_count(
    *, exactly: int | None = None, at_least: int | None = None, at_most: int | None = None
) -> UnitCount:
    """The text has so many judge words (NLTK tokens, punctuation-only ones dropped)."""
    return UnitCount("word", Bounds(exactly, at_least, at_most))


def sentence_count(
    *, exactly: int | None = None, at_least: int | None = None, at_most: int | None = None
) -> UnitCount:
    """The text has so many sentences (Punkt, English)."""
    return UnitCount("sentence", Bounds(exactly, at_least, at_most))


def paragraph_count(
    *, exactly: int | None = None, at_least: int | None = None, at_most: int | None = None
) -> UnitCount:
    """The text has so many paragraphs (pieces between ``"\\n\\n"``)."""
    return UnitCount("paragraph", Bounds(exactly, at_least, at_most))


def chars_at(positions: Mapping[int, str]) -> CharsAt:
    """The character at each position (0-based; negative from the end) is the given one."""
    return CharsAt(positions)


def words_at(positions: Mapping[int, str]) -> UnitsAt:
    """The judge's word at each position (0-based; negative from the end) is the given one."""
    return UnitsAt("word", positions)


def chars_per_word(
    *, exactly: int | None = None, at_least: int | None = None, at_most: int | None = None
) -> EachCount:
    """Every word has so many characters (c06a: ``chars_per_word(at_most=7)``)."""
    return EachCount("word", "character", Bounds(exactly, at_least, at_most))


def words_per_sentence(
    *, exactly: int | None = None, at_least: int | None = None, at_most: int | None = None
) -> EachCount:
    """Every sentence has so many words (c10: ``words_per_sentence(at_least=10, at_most=16)``)."""
    return EachCount("sentence", "word", Bounds(exactly, at_least, at_most))


def sentences_per_paragraph(
    *, exactly: int | None = None, at_least: int | None = None, at_most: int | None = None
) -> EachCount:
    """Every paragraph has so many sentences."""
    return EachCount("paragraph", "sentence", Bounds(exactly, at_least, at_most))


def first_word_of_sentences(words: str | Sequence[str]) -> EachAt:
    """Every sentence starts with ``words`` (one word for all), or sentence ``i`` with
    ``words[i]`` (then there are exactly ``len(words)`` sentences)."""
    return EachAt("sentence", "word", 0, words)


def last_word_of_sentences(words: str | Sequence[str]) -> EachAt:
    """Every sentence ends with ``words`` (one for all), or sentence ``i`` with ``words[i]``
    (then exactly ``len(words)`` sentences; c12)."""
    return EachAt("sentence", "word", -1, words)


def last_sentence_of_paragraphs(sentences: str | Sequence[str], min_sentences: int = 0) -> EachAt:
    """Paragraph ``i`` ends with ``sentences[i]`` (exactly ``len(sentences)`` paragraphs) and
    has at least ``min_sentences`` sentences (c14: ``min_sentences=2``)."""
    return EachAt("paragraph", "sentence", -1, sentences, min_inner=min_sentences)


def contains_words(words: Sequence[str]) -> WordsIncluded:
    """Every word of ``words`` is among the text's words (c07)."""
    return WordsIncluded(words)


def excludes_words(words: Sequence[str]) -> WordsExcluded:
    """None of ``words`` is among the text's words (c09)."""
    return WordsExcluded(words)
