"""Position constraints on a text's units, exact on prefixes (COLLIE's ``Position``).

:class:`UnitsAt` (the word or sentence at given positions) and :class:`EachAt` (the first
or last word of every sentence, the last sentence of every paragraph). Built by the
functions of :mod:`~llamppl.decoding.text.builders` (``words_at``,
``first_word_of_sentences``, ``last_word_of_sentences``, ``last_sentence_of_paragraphs``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from llamppl.decoding.text import automata as ta
from llamppl.decoding.text import units as tu
from llamppl.decoding.text.base import (
    TextStructure,
    check_level,
    count_marks,
    in_order_needs,
    last_word_need,
    norm_unit,
    plain_flag,
    spelled_budget,
    target_key,
    target_keys,
    unit_at,
    word_need,
)
from llamppl.decoding.text.budget import layout_facts
from llamppl.decoding.text.paragraphs import Paragraphs
from llamppl.decoding.text.prefix import Analysis, OpenWord, next_chunk
from llamppl.decoding.text.spelling import (
    can_share,
    copy_under_way,
    first_tokens,
    ids_mask,
    may_start_sentence,
    overlap_need,
    spelling,
)
from llamppl.lm.base import LanguageModel
from llamppl.validation import is_integer

__all__ = ["UnitsAt", "EachAt"]


# ---------------------------------------------------------------------- positions
def _next_word(text: str, view: Analysis) -> OpenWord | None:
    """The word being written, or the letters that open the next word of a view that is not
    exact (``Birds sing.``: a word starting ``sing``; :func:`~llamppl.decoding.text.prefix.next_chunk`)."""
    if view.open_word is not None:
        return view.open_word
    nxt = next_chunk(text, view)
    return OpenWord(nxt[0]) if nxt and nxt[0] else None


class UnitsAt(TextStructure):
    """Given words or sentences at given positions (COLLIE's ``Position``, ``==``).

    Prefix check: a certain unit at a position must equal its target, and so may the word
    being written (``"jaw"`` may still come from ``"ja"``, never from ``"Sure"``). Negative
    positions count from the end, which no prefix knows: they are checked on the finished
    text (next to an exact count of the same units a conjunction adds the positive position,
    and next to a cap on the word count the last words once the cap is reached:
    :class:`~llamppl.decoding.text.counts.UnitCount`'s ``implied``).

    Budget (words): every target at a position ``>= 0`` not yet certain needs its fewest
    spelling tokens (summed unless one token can hold two of them:
    :func:`~llamppl.decoding.text.spelling.can_share`); the last word (``-1``) needs the
    tokens that finish the word being written as the target or write it anew, none when the
    text may end on it now (:func:`~llamppl.decoding.text.base.last_word_need`); another
    negative position needs its target somewhere in the text. Positive and negative needs
    combine by their maximum (one word may be both).
    """

    def __init__(self, level: str, positions: Mapping[int, str], *, plain: bool = False) -> None:
        self.level = check_level("level", level, ("word", "sentence"))
        if not isinstance(positions, Mapping) or not positions:
            raise TypeError(
                f"positions must be a non-empty mapping index -> str, got {positions!r}"
            )
        for i in positions:
            if not is_integer(i):
                raise TypeError(f"positions keys must be integers, got {i!r}")
        self.positions = {i: target_key(t, "positions values") for i, t in positions.items()}
        self.spelled = {i: t.strip() for i, t in positions.items()}  # as given, for hints
        self.plain = plain_flag(plain)

    def target_strings(self) -> tuple[str, ...]:
        return tuple(self.spelled.values())

    def levels(self) -> frozenset[str]:
        return frozenset({self.level})

    def automaton(self) -> ta.Automaton | None:
        return ta.WordsAt(self.positions) if self.level == "word" else None

    def prefix_ok(self, text: str, view: Any) -> bool:
        for i, target in self.positions.items():
            if i < 0:
                continue
            if self.level == "word":
                unit = view.word_at(i)
                if unit is None:
                    if i == len(view.flat) + len(view.open_flat):
                        nxt = _next_word(text, view)
                        if nxt is not None and not nxt.may_become(target):
                            return False
                    continue
            else:
                unit = view.sentences[i].text if i < len(view.sentences) else None
            if unit is not None and tu.normalize(unit) != target:
                return False
        return True

    def accepts_end(self, text: str) -> bool:
        units = tu.units(text, self.level)
        return all(norm_unit(unit_at(units, i)) == t for i, t in self.positions.items())

    def _needs(self, lm: LanguageModel, state: str):
        """``(spelled, needs, here, total)`` of the target words still to write (None: none;
        the class docstring's budget)."""
        if self.level != "word":
            return None
        view = self.view_of(state)
        todo = {i: t for i, t in self.positions.items() if i >= 0 and view.word_at(i) is None}
        tail = {i: t for i, t in self.positions.items() if i < 0}
        if not todo and not tail:
            return None
        here = state[view.anchor :].lower()
        spelled, needs = [], []
        if todo:
            at = len(view.flat) + len(view.open_flat)  # the index of the word being written
            spelled = [spelling(lm, todo[i], word=True) for i in sorted(todo)]
            if view.exact:  # only the word being written may be under way
                needs = [
                    word_need(sp, view, here, set()) if i == at else sp.fresh
                    for i, sp in zip(sorted(todo), spelled)
                ]
            else:
                needs = in_order_needs(spelled, here)
        add = not (can_share(lm, list(todo.values())) or layout_facts(lm).inner_space)
        total = (sum(needs) if add else max([0, *needs])) if needs else 0
        if tail:
            present = {tu.normalize(w) for w in view.flat + view.open_flat}
            for i in sorted(tail):
                sp = spelling(lm, tail[i], word=True)
                need = (
                    last_word_need(sp, view, here)
                    if i == -1
                    else word_need(sp, view, here, present)
                )
                spelled.append(sp)
                needs.append(need)
                total = max(total, need)
        return spelled, needs, here, total

    def _budget(self, lm: LanguageModel, state: str, tokens_left: int):
        found = self._needs(lm, state)
        if found is None:
            return True, None
        spelled, needs, here, total = found
        return spelled_budget(lm, spelled, needs, here, tokens_left, total=total)

    def need(self, lm: LanguageModel, state: str) -> int:
        found = self._needs(lm, state)
        return 0 if found is None else found[3]

    def missing(self, lm: LanguageModel, state: str) -> int:
        """Targets whose unit is not yet certain (a certain unit that differs is a dead end
        the prefix check refuses; negative positions count until the end)."""
        view = self.view_of(state)
        if self.level == "word":
            return sum(i < 0 or view.word_at(i) is None for i in self.positions)
        return sum(i < 0 or i >= len(view.sentences) for i in self.positions)

    def hint(self, lm: LanguageModel, state: str) -> tuple[int, ...]:
        """The first token of the target word at the position being written, as given and
        lower-cased: the rest of it while the word being written may still become it, else
        (after a space, or after a finished word) the whole word. ``()`` when no target is
        due or the prefix's words are not certain. A position from the end is never due by
        itself (a cap on the word count says when it is:
        :class:`~llamppl.decoding.text.joint.CappedLastWords`)."""
        if self.level != "word":
            return ()
        view = self.view_of(state)
        if not view.exact:
            return ()
        at, word = len(view.flat) + len(view.open_flat), view.open_word
        if word is not None and at in self.positions and word.may_become(self.positions[at]):
            done = len(word.letters)
            rest = first_tokens(lm, [t[done:] for t in self._spellings(at)])
            if rest:
                return rest
        if word is not None:
            at, sep = at + 1, " "
        else:
            sep = "" if not state or state[-1].isspace() else " "
        return first_tokens(lm, [sep + t for t in self._spellings(at)])

    def _spellings(self, i: int) -> list[str]:
        if i not in self.spelled:
            return []
        return list(dict.fromkeys([self.spelled[i], self.spelled[i].lower()]))

    def reachable(self, lm: LanguageModel, state: str, tokens_left: int) -> bool:
        """The class docstring's budget: False when the targets still to write need more
        tokens than are left."""
        return self._budget(lm, state, tokens_left)[0]

    def budget_mask(self, lm: LanguageModel, state: str, tokens_left: int) -> torch.Tensor | None:
        return self._budget(lm, state, tokens_left)[1]

    def __repr__(self) -> str:
        return f"units_at({self.level!r}, {self.positions!r}{self.plain_repr()})"


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
    (:func:`~llamppl.decoding.text.budget.spelling`; a start already ending the text
    counts), summed over targets when the LM's tokens never straddle two sentences
    (:func:`~llamppl.decoding.text.budget.layout_facts`), else their maximum; for
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
        *,
        plain: bool = False,
    ) -> None:
        if (outer, inner) not in (("sentence", "word"), ("paragraph", "sentence")):
            raise ValueError(
                "(outer, inner) must be ('sentence', 'word') or ('paragraph', 'sentence'); "
                f"got {(outer, inner)!r}"
            )
        if not is_integer(index):
            raise TypeError(f"index must be an integer, got {index!r}")
        if not is_integer(min_inner) or min_inner < 0:
            raise ValueError(f"min_inner must be a non-negative integer, got {min_inner!r}")
        self.outer, self.inner, self.index, self.min_inner = outer, inner, index, min_inner
        self.targets: str | tuple[str, ...] = (
            target_key(targets, "targets")
            if isinstance(targets, str)
            else target_keys(targets, "targets")
        )
        self.view = "paragraph" if outer == "paragraph" else "sentence"
        self.spelled = (  # as given, for hints
            () if isinstance(targets, str) else tuple(t.strip() for t in targets)
        )
        self.raw_targets = (targets,) if isinstance(targets, str) else tuple(targets)
        self.plain = plain_flag(plain)

    def target_strings(self) -> tuple[str, ...]:
        return self.raw_targets

    def levels(self) -> frozenset[str]:
        return frozenset({self.outer, self.inner})

    def automaton(self) -> ta.Automaton | None:
        if self.outer == "paragraph":
            count = None if isinstance(self.targets, str) else len(self.targets)
            return ta.ParagraphEnds(count, max(self.min_inner, 1)) if self.index == -1 else None
        kind = {0: ta.FirstWords, -1: ta.LastWords}.get(self.index)
        return None if kind is None else kind(self.targets)

    def _target(self, k: int) -> str | None:
        if isinstance(self.targets, str):
            return self.targets
        return self.targets[k] if k < len(self.targets) else None

    def _unit_ok(self, k: int, units: Sequence[str]) -> bool:
        target = self._target(k)
        if target is None or len(units) < self.min_inner:
            return False
        return norm_unit(unit_at(units, self.index)) == target

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
            nxt = _next_word(text, a)
            if nxt is not None and self.index == len(a.open_nested):
                return nxt.may_become(target)
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

    def _needs(self, lm: LanguageModel, state: str):
        """``(spelled, needs, here, extra, add, paragraph)`` of the targets still to write
        (list targets, ``index == -1``; None otherwise): the class docstring's budget."""
        if isinstance(self.targets, str) or self.index != -1:
            return None
        view = self.view_of(state)
        separate = layout_facts(lm).separate_sentences
        last = len(self.targets) - 1
        if self.outer == "sentence":
            done, here = len(view.sentences), state[view.anchor :].lower()
            spelled = [
                spelling(lm, t, mark=done + k < last, word=True)
                for k, t in enumerate(self.targets[done:])
            ]
            if view.exact:  # no mark ahead: only the open sentence's last word may be under way
                needs = [word_need(spelled[0], view, here, set())]
                needs += [sp.fresh for sp in spelled[1:]]
            else:  # the targets must stand in order, each before a mark
                needs = in_order_needs(spelled, here)
            return spelled, needs, here, 0, separate, False
        done, here = len(view.final), view.open_text.lower()
        rest = self.targets[done:]
        if not rest:
            return [], [], here, 0, separate, True
        first = spelling(lm, rest[0], sentence=True)
        need_first = overlap_need(first, here)
        future = sum(spelling(lm, t).fresh for t in rest[1:])
        extra = self._paragraph_extra(lm, view, need_first, rest) + future
        return [first], [need_first], here, extra, separate, True

    def _budget(self, lm: LanguageModel, state: str, tokens_left: int):
        found = self._needs(lm, state)
        if found is None:
            return True, None
        spelled, needs, here, extra, add, paragraph = found
        if not spelled:
            return True, None
        ok, mask = spelled_budget(lm, spelled, needs, here, tokens_left, extra=extra, add=add)
        if paragraph and mask is not None:
            mask |= ids_mask(lm, "boundary")  # marks and delimiters are progress too
        return ok, mask

    def need(self, lm: LanguageModel, state: str) -> int:
        found = self._needs(lm, state)
        if found is None or not found[0]:
            return 0
        _, needs, _, extra, add, _ = found
        return (sum(needs) + extra) if add else max([0, *needs])

    def reachable(self, lm: LanguageModel, state: str, tokens_left: int) -> bool:
        return self._budget(lm, state, tokens_left)[0]

    def budget_mask(self, lm: LanguageModel, state: str, tokens_left: int) -> torch.Tensor | None:
        return self._budget(lm, state, tokens_left)[1]

    def missing(self, lm: LanguageModel, state: str) -> int:
        """List targets whose outer unit is not yet certain (the prefix check has checked
        every certain one); 0 for one target shared by every unit, which names no count.

        A paragraph's required last sentence counts its words (copying one costs the LM a
        few nats per word); the words of a copy under way (``copy_under_way``, each word as
        it begins) count as written once the paragraph's ``min_inner - 1`` free sentences
        before it are certain: credit word by word, lost when the copy breaks."""
        if isinstance(self.targets, str):
            return 0
        view = self.view_of(state)
        done = len(view.sentences) if self.outer == "sentence" else len(view.final)
        if not self.spelled or self.outer != "paragraph" or self.index != -1:
            return max(0, len(self.targets) - done)
        if done >= len(self.spelled):
            return 0
        left = sum(len(t.split()) for t in self.spelled[done:])
        copy = copy_under_way(view.open_text, self.spelled[done])
        a: Analysis = view.open
        if copy is None or len(a.sentences) < self.min_inner - 1 or copy[0] < a.anchor:
            return left
        return left - len(self.spelled[done][: copy[1]].split())  # words begun, as given

    def hint(self, lm: LanguageModel, state: str) -> tuple[int, ...]:
        """For the last sentence of each paragraph (list targets): the next token of the open
        paragraph's target sentence while a copy of it is under way
        (:func:`~llamppl.decoding.text.spelling.copy_under_way`), the paragraph delimiter
        once the copy is finished (not after the last target), and its first token where a
        sentence may start once the paragraph holds its free sentences (``min_inner - 1``
        marks); ``()`` otherwise."""
        if self.outer != "paragraph" or self.index != -1 or not self.spelled:
            return ()
        view = self.view_of(state)
        k, text = len(view.final), view.open_text
        if k >= len(self.spelled):
            return ()
        target = self.spelled[k]
        copy = copy_under_way(text, target)
        if copy is not None:
            if copy[1] < len(target):
                return first_tokens(lm, [target[copy[1] :]])
            last = k == len(self.spelled) - 1
            return () if last else first_tokens(lm, [tu.PARAGRAPH_DELIMITER])
        if count_marks(text) < self.min_inner - 1 or not may_start_sentence(text, len(text)):
            return ()
        sep = " " if text and not text[-1].isspace() else ""
        return first_tokens(lm, [sep + target])

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
        marks = count_marks(view.open_text[a.anchor :])
        if not a.content or (marks == 0 and first == spelling(lm, rest[0]).fresh):
            # nothing open, or one unfinished sentence that is not the last one under way:
            # it needs a mark, in a token of its own, and the other free sentences follow
            return extra + max(0, free - done)
        return extra + max(0, free - done - marks - 1)

    def __repr__(self) -> str:
        return (
            f"each_at({self.outer!r}, {self.inner!r}, {self.index}, {self.targets!r}"
            f"{f', min_inner={self.min_inner}' if self.min_inner else ''}{self.plain_repr()})"
        )
