"""What a cap on the word count implies together with last words and required words.

A conjunction ``a & b`` (:class:`~llamppl.decoding.constraints.protocol.AllOf`) asks each part
about a prefix on its own. ``word_count(exactly=8) & last_word_of_sentences(["ocean"])``
then lets ``"... with the"`` through: seven words and an 8th being written pass the count,
and a sentence still open passes the last word, though no continuation can pass both (the
8th word is the last one, and ``the`` never becomes ``ocean``). The classes here are the
constraints such a conjunction *implies*, added by
:meth:`~llamppl.decoding.text.counts.UnitCount.implied` when the conjunction is built:

- :class:`CappedLastWords` — ``word_count(at_most=n)`` (or ``exactly=n``) with
  ``words_at({-k: w})``: once ``n`` words are certain (or ``n`` chunks hold a letter), the
  text has no other words, so its ``k``-th word from the end is the ``(n - k + 1)``-th,
  certain or being written;
- :class:`SentenceEndsAtCap` — a cap with ``last_word_of_sentences``: every sentence still to
  come needs a word of its own, and once the cap is reached the word being written (or the
  last one written) ends the last sentence, so it must be (or may become) its target;
- :class:`RequiredWordsFit` — a cap with ``contains_words``: the words still allowed must
  leave room for the required words not yet written (the word being written may be one).

Each one's complete check is the conjunction of the constraints it comes from (``sources``),
so it holds on every text of the target, and its prefix check is sound for it: it refuses a
prefix only when no continuation passes every source (the reasoning is in each class's
docstring, on the certain words of :mod:`~llamppl.decoding.text.prefix`). Adding one leaves
the posterior unchanged; ``tests/decoding/test_text_joint.py`` checks both claims by brute
force. Each also hints the target word when it is due (the cap's last word, or a required
word when every word left must be one), and names no target of its own (``missing`` is 0:
its sources already count theirs).
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence

from llamppl.decoding.constraints.protocol import Constraint
from llamppl.decoding.text import units as tu
from llamppl.decoding.text.base import TextStructure, target_key, target_keys
from llamppl.decoding.text.positions import UnitsAt
from llamppl.decoding.text.prefix import Analysis, floor_words
from llamppl.decoding.text.spelling import first_tokens
from llamppl.lm.base import LanguageModel
from llamppl.validation import is_integer

__all__ = ["CappedLastWords", "SentenceEndsAtCap", "RequiredWordsFit"]


def _cap(cap: object) -> int:
    if not is_integer(cap) or cap < 0:  # type: ignore[operator]
        raise ValueError(f"cap must be a non-negative integer, got {cap!r}")
    return int(cap)  # type: ignore[arg-type]


def _sources(sources: Sequence[Constraint]) -> tuple[Constraint, ...]:
    if not sources or not all(isinstance(s, Constraint) for s in sources):
        raise TypeError(f"sources must be a non-empty sequence of constraints, got {sources!r}")
    return tuple(sources)


STRIPPED = string.punctuation + " "  # what COLLIE's comparison strips from a unit's ends


def fits(entry: tuple[str, str], target: str) -> bool:
    """Whether one word of :func:`~llamppl.decoding.text.prefix.floor_words`, when it must be
    exactly one judge word (the count is full), is ``target`` (a certain word, or a complete
    chunk, which compares as the chunk itself) or may still become it (the text's last
    chunk, which only grows at its end: its letters so far start the target, or it is the
    target followed by punctuation)."""
    kind, unit = entry
    if kind != "open":
        return tu.normalize(unit) == target
    core = unit.lower().lstrip(STRIPPED)
    return target.startswith(core) or core.rstrip(STRIPPED) == target


def full_words(text: str, view: Analysis, cap: int) -> tuple[tuple[str, str], ...] | None:
    """The region's words (:func:`~llamppl.decoding.text.prefix.floor_words`) when they and
    the certain sentences' words already number ``cap``: then, under the cap, each entry is
    exactly one word and no word comes after them. None otherwise."""
    words = floor_words(text, view)
    if not words or len(view.flat) + len(words) != cap:
        return None
    return words


class Implied(TextStructure):
    """Base class: a constraint implied by its ``sources`` (its complete check is theirs)."""

    sources: tuple[Constraint, ...] = ()

    def accepts_end(self, text: str) -> bool:
        return all(s.checked(True, text) for s in self.sources)


class CappedLastWords(Implied):
    """The words at negative positions, once the word count reaches its cap.

    Implied by ``word_count(at_most=cap)`` (or ``exactly=cap``) and ``words_at`` with the
    positions ``positions`` (all negative). Prefix check: when ``cap`` words are certain (the
    word being written among them), every continuation that keeps to the cap has exactly
    these words, so the word at ``-k`` is the word at ``cap - k``: certain (it must equal its
    target) or the one being written (it must be able to become it); a text of fewer than
    ``k`` words has none. Likewise when the certain sentences' words and the fewest words of
    the open region (:func:`~llamppl.decoding.text.prefix.floor_words`, where marks or quotes
    leave its words undecided) number ``cap``: each is then exactly one word (:func:`fits`).
    Hint: the target of ``-1`` when the ``cap``-th word is next or being written.
    """

    def __init__(
        self, cap: int, positions: Mapping[int, str], sources: Sequence[Constraint]
    ) -> None:
        self.cap = _cap(cap)
        if not isinstance(positions, Mapping) or not positions:
            raise TypeError(f"positions must be a non-empty mapping, got {positions!r}")
        if not all(is_integer(i) and i < 0 for i in positions):
            raise ValueError(f"positions must be negative integers, got {sorted(positions)!r}")
        self.positions = {i: target_key(t, "positions values") for i, t in positions.items()}
        self.sources = _sources(sources)
        last = {self.cap - 1: positions[-1].strip()} if -1 in positions and self.cap else None
        self.due = None if last is None else UnitsAt("word", last)

    def prefix_ok(self, text: str, view: Analysis) -> bool:
        if view.certain_words == self.cap:  # the certain words are all the words
            words = view.flat + view.open_flat
            for i, target in self.positions.items():
                j = self.cap + i
                if j < 0:
                    return False
                if j == len(words):  # the word being written (exact analyses only)
                    if view.open_word is None or not view.open_word.may_become(target):
                        return False
                elif tu.normalize(words[j]) != target:
                    return False
        words = full_words(text, view, self.cap)
        if words is None:
            return True
        base = len(view.flat)  # then one word per entry, after the certain sentences' words
        for i, target in self.positions.items():
            j = self.cap + i
            if j < 0:
                return False
            if j < base:
                if tu.normalize(view.flat[j]) != target:
                    return False
            elif not fits(words[j - base], target):
                return False
        return True

    def hint(self, lm: LanguageModel, state: str) -> tuple[int, ...]:
        return () if self.due is None else self.due.hint(lm, state)

    def __repr__(self) -> str:
        return f"capped_last_words({self.cap}, {self.positions!r})"


class SentenceEndsAtCap(Implied):
    """The last word of every sentence, and room for the sentences to come, under a cap.

    Implied by ``word_count(at_most=cap)`` (or ``exactly=cap``) and
    ``last_word_of_sentences(targets)`` (one word for every sentence, or a list: one per
    sentence, so exactly that many). Prefix check:

    1. On an exact analysis (no mark in the open region, so it lies in one sentence, the
       next after the certain ones): the open sentence still needs a word of its own unless
       the word being written may become its target (or, after a space, its last word is
       it), and every sentence still to come after it (a list fixes how many) needs one
       (its last word, a target): the certain words and those must fit under the cap. So
       once the cap is reached, the open sentence ends on the word being written, which must
       be able to become its target (``"... with the"`` is refused: the 8th word is ``the``).
    2. On any analysis: when the certain sentences' words and the fewest words of the open
       region (:func:`~llamppl.decoding.text.prefix.floor_words`) number ``cap``, each is
       exactly one word and no word comes after the last one, which therefore ends the last
       sentence: it must be, or may still become, the last target (:func:`fits`; in
       ``Mr. Black endures`` the 8th word is under way in ``endures``, no start of
       ``ocean``).

    Runs of dots are why this is its own constraint and not the word at position ``cap - 1``:
    ``"A b ocean..."`` has the words ``A, b, ocean, ""`` but its sentence ends in ``ocean``.
    Hint: the open sentence's target when the cap leaves no word to spare (its rest while
    the word being written may become it, else the whole word next).
    """

    def __init__(
        self, cap: int, targets: str | Sequence[str], sources: Sequence[Constraint]
    ) -> None:
        self.cap = _cap(cap)
        if isinstance(targets, str):
            self.count, self.spelled = None, (targets.strip(),)
            self.targets = target_key(targets, "targets")
        else:
            self.targets = target_keys(targets, "targets")
            self.count, self.spelled = len(self.targets), tuple(t.strip() for t in targets)
        self.sources = _sources(sources)

    def _target(self, k: int) -> tuple[str, str]:
        """The ``k``-th sentence's target: (key, as given)."""
        if self.count is None:
            return self.targets, self.spelled[0]  # type: ignore[return-value]
        return self.targets[k], self.spelled[k]

    def _room(self, view: Analysis) -> tuple[int, bool] | None:
        """``(spare, ends)`` on an exact analysis with an open sentence that has a target:
        words the cap allows beyond those rule 1 counts, and whether the open sentence may
        end on its word being written (or its last word). None otherwise."""
        left = 0 if self.count is None else self.count - len(view.sentences) - view.content
        if not view.exact or left < 0:
            return None
        ends = False
        if view.content:
            target = self._target(len(view.sentences))[0]
            word = view.open_word
            if word is not None:
                ends = word.may_become(target)
            elif view.open_flat:
                ends = tu.normalize(view.open_flat[-1]) == target
        need = view.certain_words + left + (1 if view.content and not ends else 0)
        return self.cap - need, ends

    def prefix_ok(self, text: str, view: Analysis) -> bool:
        room = self._room(view)
        if room is not None and room[0] < 0:
            return False
        words = full_words(text, view, self.cap)  # rule 2
        if words is None:
            return True
        last = self.targets if self.count is None else self.targets[-1]
        return fits(words[-1], last)  # type: ignore[arg-type]

    def hint(self, lm: LanguageModel, state: str) -> tuple[int, ...]:
        view = self.view_of(state)
        room = self._room(view)
        if room is None or room[0] != 0 or not view.content:
            return ()
        key, given = self._target(len(view.sentences))
        forms = list(dict.fromkeys([given, given.lower()]))
        word = view.open_word
        if room[1]:  # the word being written must become the target: its rest
            if word is None or not key.startswith(word.letters.lower()):
                return ()
            return first_tokens(lm, [f[len(word.letters) :] for f in forms])
        sep = " " if word is not None or not state[-1:].isspace() else ""
        return first_tokens(lm, [sep + f for f in forms])

    def __repr__(self) -> str:
        return f"sentence_ends_at_cap({self.cap}, {self.targets!r})"


class RequiredWordsFit(Implied):
    """The required words not yet written fit in the words the cap still allows.

    Implied by ``word_count(at_most=cap)`` (or ``exactly=cap``) and ``contains_words(words)``.
    Prefix check: every word of a continuation is a certain word, the word being written
    (which becomes a word that starts with its letters, or a shorter form the Treebank rules
    cut out of it), or a new word; each required word not among the certain ones needs one
    of them, so they must number at most the words the cap leaves, plus one when the word
    being written may become one of them. Hint: when every word left must be a required
    one, the rest of the required word being written, else the start of each required word.
    """

    def __init__(self, cap: int, words: Sequence[str], sources: Sequence[Constraint]) -> None:
        self.cap = _cap(cap)
        keys = target_keys(words, "words")
        self.words = tuple(dict.fromkeys(keys))
        self.spelled: dict[str, list[str]] = {}
        for key, given in zip(keys, words):
            forms = self.spelled.setdefault(key, [])
            forms += [f for f in (given.strip(), given.strip().lower()) if f not in forms]
        self.sources = _sources(sources)

    def _room(self, view: Analysis) -> tuple[list[str], int, bool]:
        """``(left, spare, covers)``: required words not certain, words the cap allows beyond
        them, whether the word being written may become one of them."""
        present = {tu.normalize(w) for w in view.flat + view.open_flat}
        left = [w for w in self.words if w not in present]
        word = view.open_word
        covers = word is not None and any(word.may_become(w) for w in left)
        return left, self.cap - view.certain_words - len(left) + covers, covers

    def prefix_ok(self, text: str, view: Analysis) -> bool:
        left, spare, _ = self._room(view)
        return not left or spare >= 0

    def hint(self, lm: LanguageModel, state: str) -> tuple[int, ...]:
        view = self.view_of(state)
        if not view.exact:
            return ()
        left, spare, covers = self._room(view)
        if not left or spare != 0:
            return ()
        word = view.open_word
        if word is not None and covers:
            done = len(word.letters)
            low = word.letters.lower()
            rests = [f[done:] for w in left if w.startswith(low) for f in self.spelled[w]]
            return first_tokens(lm, rests)
        sep = " " if word is not None or (state and not state[-1].isspace()) else ""
        return first_tokens(lm, [sep + f for w in left for f in self.spelled[w]])

    def __repr__(self) -> str:
        return f"required_words_fit({self.cap}, {list(self.words)!r})"
