"""Whether a plain prefix can still be completed for a whole conjunction of text builders.

Each part of ``sentence_count(exactly=3) & words_per_sentence(exactly=6)`` accepts ``"In a
garden, Emily in the "`` on its own: one sentence so far, six words in it. Together with
plain characters no continuation passes: after a space comes a letter (no mark after a
space), so a seventh word, and the sentence cannot end before it. :class:`ShapeFit` is the
part a conjunction adds for such cases (:meth:`~llamppl.decoding.text.base.TextConstraint.implied`):

1. the prefix is read as a stream of the judge's units (:func:`~llamppl.decoding.text.shape.read`:
   words, sentence ends, paragraph breaks, the word being written, the undecided marks read
   both ways);
2. every builder of the conjunction is an automaton on that stream
   (:mod:`~llamppl.decoding.text.automata`), and the prefix puts their product in a state;
3. the prefix passes when some continuation of the stream reaches a state that every
   automaton accepts at the end: a search over the product (depth first, each state's
   verdict memoised, so a prefix check is a lookup once its state has been seen). The
   moves are those plain characters allow: a new word (any word a builder names, or a
   word none names, with a length ``chars_per_word`` and the longest run allow), a
   sentence end right after a word's last letter, a paragraph break where newlines are
   allowed, and for the word being written: finish it as it is, grow it into a longer word
   (a target it starts, or another word), or cut a shorter form off it (``don`` + ``'t``).

Every move is a plain text the judge reads as the move says (a new word after a space,
``!`` for a sentence end, ``"\\n\\n"`` for a paragraph break), and every plain continuation
is such a sequence of moves, so the prefix check is exact for the builders it reads: it
refuses a prefix exactly when no continuation passes them all. Two places read more than a
continuation can do, and there it stays sound but not tight: a period after an
abbreviation, an initial or a number is read both ways until Punkt decides it, and a word
being written that holds an apostrophe or a target's own non-letter character may become
any word. Builders it does not read (``sentence_count``'s positions of whole sentences,
per-unit counts other than the builders', a user's own check) are left to their own
checks. The complete check is the sources' own, so the target does not change;
``tests/decoding/test_text_shapes.py`` checks both claims by brute force and by search.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from llamppl.decoding.constraints.protocol import Constraint
from llamppl.decoding.text import units as tu
from llamppl.decoding.text.automata import OTHER, Automaton
from llamppl.decoding.text.plain import PlainCharacters
from llamppl.decoding.text.prefix import OpenWord, analyze, chunk_words
from llamppl.decoding.text.shape import (
    MAX_UNDECIDED,
    PARA,
    STOP,
    Reading,
    certain_events,
    last_chunk,
    last_space,
    region_events,
)
from llamppl.decoding.text.spelling import first_tokens
from llamppl.lm.base import LanguageModel
from llamppl.lm.memo import LRU

__all__ = ["ShapeFit", "strict", "MEMO_STATES", "MAX_SEARCH"]

CLITICS = (
    "s",
    "m",
    "d",
    "ll",
    "re",
    "ve",
    "t",
    "'",
    "'s",
    "'m",
    "'d",
    "'ll",
    "'re",
    "'ve",
    "'t",
    "n't",
)
"""What may end a chunk after an apostrophe, or bring one: the Treebank rules split some off."""
SPECIAL = ("cannot", "gimme", "gonna", "gotta", "lemme", "wanna", "more", "twas", "tis", "ye")
"""Words the Treebank rules read by their letters (contractions split at fixed places)."""
_RUN = re.compile(r"[A-Za-z]{4,}")
MEMO_STATES = 200_000
"""States whose verdict a :class:`ShapeFit` remembers (then it starts afresh)."""
MAX_SEARCH = 5_000
"""States one search may visit (a few hundred milliseconds); past it the search claims
nothing: its start counts as feasible, so the prefix passes."""


def strict(plain: PlainCharacters) -> bool:
    """Whether ``plain`` keeps texts to the chunks :mod:`~llamppl.decoding.text.shape` reads:
    a space after every mark, no mark or quote opening a sentence or following a space."""
    return plain.spaced_marks and not plain.open_marks and plain.max_run is not None


class ShapeFit(Constraint):
    """The joint prefix check of a conjunction's text builders under plain characters (module
    docstring).

    Parameters
    ----------
    automata
        One automaton per builder read (:mod:`~llamppl.decoding.text.automata`).
    plain
        The conjunction's plain characters (strict: :func:`strict`).
    sources
        The builders; the complete check is theirs.
    """

    def __init__(
        self, automata: Sequence[Automaton], plain: PlainCharacters, sources: Sequence[Constraint]
    ) -> None:
        if not automata or not all(isinstance(a, Automaton) for a in automata):
            raise TypeError(f"automata must be a non-empty sequence of automata, got {automata!r}")
        if not isinstance(plain, PlainCharacters) or not strict(plain):
            raise ValueError(f"plain must be strict plain characters, got {plain!r}")
        if not sources or not all(isinstance(s, Constraint) for s in sources):
            raise TypeError(f"sources must be a non-empty sequence of constraints, got {sources!r}")
        self.automata, self.plain, self.sources = tuple(automata), plain, tuple(sources)
        self.names = frozenset().union(*(a.names for a in self.automata))
        lows = [a.lengths[0] for a in self.automata if a.lengths[0] is not None]
        highs = [a.lengths[1] for a in self.automata if a.lengths[1] is not None]
        self.lengths = (max(lows, default=None), min(highs, default=None))  # chars_per_word
        self.run = plain.max_run
        self.shortest = max([1, *lows])
        self.longest = min([self.run, *highs])
        self.paragraphs = "\n" in plain.chars
        targets = frozenset().union(*(a.targets for a in self.automata))
        self.alphabet = tuple(sorted(t for t in targets if self._writable(t)))
        if self.shortest <= self.longest:  # a word no builder names can be written
            self.alphabet += (OTHER,)
        self._verdicts: dict[tuple, bool] = {}
        self._starts: LRU[str, tuple | None] = LRU(4096)  # after the certain sentences
        self._bases: LRU[tuple, list | None] = LRU(4096)  # after the complete chunks
        self._after_reading: LRU[tuple, tuple] = LRU(16_384)  # after the last chunk
        self._kept = tuple(n.lower() for n in self.names) + SPECIAL
        self.capped = 0
        """Searches that stopped at :data:`MAX_SEARCH` and claimed nothing (module docstring)."""

    def _canonical(self, chunk: str) -> str:
        """``chunk`` with each run of four or more letters that no name or contraction holds
        written as ``q``s (its last letter kept when it is an ``n``: ``n't``): the Treebank
        rules read such a run only as letters, so the chunk's words have the same kinds and
        lengths, and chunks that differ so share one memoised set of moves."""

        def canon(m: re.Match) -> str:
            run = m.group()
            low = run.lower()
            if any(low in k for k in self._kept):
                return run
            return "q" * (len(run) - 1) + (run[-1] if run[-1] in "nN" else "q")

        return _RUN.sub(canon, chunk)

    # ------------------------------------------------------------ words
    def _writable(self, t: str) -> bool:
        """Whether a target may be written as a word: its length is one the builders allow.
        (A target the Treebank rules split when it stands alone, ``it's``, may still be one
        word in some context, ``it's's``: it stays a move.)"""
        return self.shortest <= len(t) <= self.longest

    def _kind(self, x: str) -> str:
        return x if x in self.names else OTHER

    def _mark_after(self, x: str) -> bool:
        """Whether a mark may follow the word ``x`` (its run leaves room for one)."""
        return (self.shortest if x == OTHER else len(x)) < self.run

    def _open_moves(self, letters: str) -> list[tuple[tuple[str, ...], str | None, bool]]:
        """The word being written, as ``(words, kind, mark)`` moves (the words it finishes as,
        then one more word of ``kind`` when not None; ``mark``: a mark may follow): finish it
        as it is, grow it into a target it starts or into a word no builder names, or have
        the Treebank rules cut it (:meth:`~llamppl.decoding.text.prefix.OpenWord.cuts`)."""
        n, low = len(letters), letters.lower()
        itself = chunk_words(letters, False)  # ``cannot`` is two words as it stands
        moves: list[tuple[tuple[str, ...], str | None, bool]] = [(itself, None, n < self.run)]
        for t in self.alphabet:
            if t != OTHER and len(t) > n and t.startswith(low):
                moves.append(((), t, self._mark_after(t)))
        grown = max(n + 1, self.shortest)
        if grown <= self.longest:
            moves.append(((), OTHER, grown < self.run))
        moves += [(cut, None, True) for cut in OpenWord(letters).cuts()]
        return moves

    def _chunk_moves(self, chunk: str) -> list[tuple[tuple[str, ...], str | None, bool | None]]:
        """A last chunk that holds more than letters (``It'``, ``garden's``, ``Pre-Pal``), as
        moves like :meth:`_open_moves`: the Treebank words of the chunk once finished, for
        every way to finish it that the builders can tell apart: now; its last word grown by
        letters to each length that matters (one, the most the run allows, the bounds of
        ``chars_per_word``) or into a target it starts; and each of those followed by a clitic
        the rules split off or keep (``'s``, ``n't``, ``'``, ...). The rules read a chunk at
        the very end of the text differently when it ends in a quote (``Go's's'`` is one word
        there, two before a space): such an ending is a move after which only the end may
        come (``mark`` None)."""
        room = self.run - len(chunk)
        words = chunk_words(chunk, False)
        tail = len(words[-1]) if words else 0
        lo, hi = self.lengths
        grown = {"q" * j for j in (1, room, (lo or 0) - tail, (hi or 0) - tail) if 1 <= j <= room}
        low = chunk.lower()
        grown |= {t[len(low) :] for t in self.alphabet if t != OTHER and t.startswith(low)}
        rests = {g + c for g in grown | {""} for c in ("", *CLITICS) if len(g + c) <= room}
        moves: list[tuple[tuple[str, ...], str | None, bool | None]] = []
        for rest in sorted(rests):
            word = chunk + rest
            inside = chunk_words(word, False)  # whitespace or a mark follows
            moves.append((inside, None, len(word) < self.run))
            last = tuple(tu.span_words(" " + word))  # the text ends here: ``Go's's'`` is one
            if last != inside:
                moves.append((last, None, None))
        return moves

    # ------------------------------------------------------------ the product
    def _apply(self, state: tuple, event: Any, move: bool = True) -> tuple | None:
        """The product state after ``event``: a move of a continuation (``move``: a word is a
        kind, and a sentence end needs a word's last letter right before it), or an event of
        the text itself (a word is its unit, of a length ``chars_per_word`` must allow)."""
        out: list = []
        if event is STOP:
            if move and not state[0]:
                return None
            for a, s in zip(self.automata, state[1:]):
                s = a.stop(s)
                if s is None:
                    return None
                out.append(s)
            return (False, *out)
        if event is PARA:
            for a, s in zip(self.automata, state[1:]):
                s = a.para(s)
                if s is None:
                    return None
                out.append(s)
            return (False, *out)
        if move:
            x = event
        else:
            lo, hi = self.lengths
            if (lo is not None and len(event) < lo) or (hi is not None and len(event) > hi):
                return None
            x = self._kind(tu.normalize(event))
        for a, s in zip(self.automata, state[1:]):
            s = a.word(s, x)
            if s is None:
                return None
            out.append(s)
        return (self._mark_after(x), *out)

    def _ends(self, state: tuple) -> bool:
        return all(a.end(s) for a, s in zip(self.automata, state[1:]))

    def _moves(self, state: tuple):
        if state[0] is None:  # the text must end here
            return
        if state[0]:
            yield self._apply(state, STOP)
        for x in self.alphabet:
            yield self._apply(state, x)
        if self.paragraphs:
            yield self._apply(state, PARA)

    def feasible(self, start: tuple) -> bool:
        """Whether some continuation from the product state ``start`` (its first entry: a
        mark may come next, or None when only the end may) ends where every automaton accepts (depth first; verdicts memoised: the states on a path that reaches
        an end are feasible, and when none does every state seen is not)."""
        verdicts = self._verdicts
        found = verdicts.get(start)
        if found is not None:
            return found
        if len(verdicts) > MEMO_STATES:
            verdicts.clear()
        if self._ends(start):
            verdicts[start] = True
            return True
        seen, path, moves = {start}, [start], [self._moves(start)]
        while moves:
            nxt = next(moves[-1], False)
            if nxt is False:
                moves.pop()
                path.pop()
                continue
            if nxt is None or nxt in seen or verdicts.get(nxt) is False:
                continue
            if verdicts.get(nxt) or self._ends(nxt):
                for s in (*path, nxt):
                    verdicts[s] = True
                return True
            seen.add(nxt)
            if len(seen) > MAX_SEARCH:  # too large to settle here: claim nothing
                self.capped += 1
                verdicts[start] = True
                return True
            path.append(nxt)
            moves.append(self._moves(nxt))
        for s in seen:
            verdicts[s] = False
        return False

    def _replay(self, state: tuple | None, events: tuple) -> tuple | None:
        for event in events:
            if state is None:
                return None
            state = self._apply(state, event, move=False)
        return state

    def _base(self, text: str, anchor: int, cut: int) -> list[tuple] | None:
        """The product states after the certain sentences and the open region's complete
        chunks (``text[:cut]``; ``[]``: a builder is broken for good; None: unreadable)."""
        head = text[:anchor]
        if head in self._starts:
            start = self._starts.get(head)
        else:
            certain = certain_events(head)
            if certain is None or certain.count(STOP) != len(analyze(text).sentences):
                start = None
            else:
                start = self._replay((False, *(a.start() for a in self.automata)), certain)
                start = () if start is None else start
            self._starts.put(head, start)
        if start is None:
            return None
        if not start:
            return []
        branches = region_events(text[anchor:cut])
        if branches is None:
            return None
        out = {self._replay(start, events) for events in branches}
        return [(False, *s[1:]) for s in out if s is not None]

    def states(self, text: str) -> list[tuple] | None:
        """The product states the prefix ``text`` may be in (one per reading and move of the
        word being written; ``[]``: it has broken some builder for good), or None when the
        prefix cannot be read (then nothing is claimed)."""
        anchor = analyze(text).anchor
        cut = last_space(text, anchor)
        key = (anchor, text[:cut])  # the complete chunks fix the states they lead to
        if key in self._bases:
            base = self._bases.get(key)
        else:
            base = self._base(text, anchor, cut)
            self._bases.put(key, base)
        last = last_chunk(text[cut:])
        if base is None or last is None or len(base) * len(last) > 2**MAX_UNDECIDED:
            return None
        return [s for state in base for r in last for s in self._reading_states(state, r)]

    def _reading_states(self, start: tuple, reading: Reading) -> tuple[tuple, ...]:
        """The states after ``reading``'s events and the moves of its open word (memoised)."""
        if reading.open_chunk:
            reading = replace(reading, open_chunk=self._canonical(reading.open_chunk))
        key = (start, reading)
        found = self._after_reading.get(key)
        if found is None:
            found = tuple(self._read_moves(start, reading))
            self._after_reading.put(key, found)
        return found

    def _read_moves(self, start: tuple, reading: Reading) -> list[tuple]:
        state = self._replay(start, reading.events)
        if state is None:
            return []
        if reading.open_word is not None:
            moves = self._open_moves(reading.open_word)
        elif reading.open_chunk:
            moves = self._chunk_moves(reading.open_chunk)
        else:  # whitespace or a mark ends the text: no mark may come next
            return [(False, *state[1:])]
        out = []
        for words, kind, mark in moves:
            after: tuple | None = state
            for w in words:
                after = self._apply(after, w, move=False) if after is not None else None
            if after is not None and kind is not None:
                after = self._apply(after, kind)
            if after is not None:
                out.append((mark, *after[1:]))
        return out

    def due(self, text: str) -> bool:
        """Whether the word being written must end its sentence: after it as it stands a
        sentence end leads to a completion and no new word does."""
        anchor = analyze(text).anchor
        cut = last_space(text, anchor)
        base, last = self._bases.get((anchor, text[:cut])), last_chunk(text[cut:])
        if not base or not last or any(r.open_word is None for r in last):
            return False
        ends = [
            self._replay(start, r.events + chunk_words(r.open_word, False))
            for start in base
            for r in last
        ]
        ends = [(len(last[0].open_word) < self.run, *s[1:]) for s in ends if s is not None]
        return bool(ends) and all(  # the word may end here, and then only a sentence end fits
            self._feasible_after(s, STOP)
            and not any(self._feasible_after(s, x) for x in self.alphabet)
            for s in ends
        )

    def _feasible_after(self, state: tuple, event: Any) -> bool:
        nxt = self._apply(state, event)
        return nxt is not None and self.feasible(nxt)

    # ------------------------------------------------------------ the protocol
    def hint(self, lm: LanguageModel, state: Any) -> tuple[int, ...]:
        """The tokens of a sentence end (``.``, ``!``, ``?``) when the word being written must
        end its sentence (:meth:`due`), else ``()``."""
        if not isinstance(state, str) or not self(state) or not self.due(state):
            return ()
        return first_tokens(lm, [".", "!", "?"])

    def __call__(self, text: str) -> bool:
        found = self.states(text)
        return found is None or any(self.feasible(s) for s in found)

    def accepts_end(self, text: str) -> bool:
        return all(s.checked(True, text) for s in self.sources)

    def allows(self, lm: LanguageModel, state: Any, token: int) -> bool:
        """The memoised prefix check of ``state + token`` (the analysis started from ``state``'s)."""
        return self._after(state, state + lm.vocab[token])

    def text_check(self, lm: LanguageModel, state: Any) -> Callable[[str], bool] | None:
        """The prefix check of ``state + x`` for any string ``x`` (sound, listed on the trie as
        :meth:`~llamppl.decoding.text.base.TextStructure.text_check` is)."""
        if not isinstance(state, str):
            return None
        return lambda x: self._after(state, state + x)

    def _after(self, state: str, text: str) -> bool:
        analyze(text, state)
        return self.checked(False, text)

    def __repr__(self) -> str:
        return f"shape_fit({', '.join(map(repr, self.sources))})"
