"""The constraint protocol: what a hard constraint answers, so one program can enforce any of them.

A *constraint* describes the set C of the LLaMPPL paper (§2.2, hard constraints):
the prefixes that can still be completed into an acceptable string, and C_F, the
acceptable finished strings. Text constraints, grammars (JSON Schema, regex, Lark;
:class:`~llamppl.decoding.grammar.compile.Grammar`) and a user's own Python
predicate all implement the same protocol, so :class:`~llamppl.models.HardConstraint`
enforces any of them and ``&`` composes any two:

``state = c.start(lm)``
    The particle's state before any generated token (the text ``""`` for text
    constraints, a grammar matcher for grammars). The particle owns it and clones it
    with itself (``copy.deepcopy``).
``c.allows(lm, state, w) -> bool``
    The *prefix check*: may token ``w`` come next (is s·w in C)? Never called for an
    end token (EOS).
``c.ends(lm, state) -> bool``
    The *complete check*: may the string end here (is s in C_F)?
``state = c.advance(lm, state, w)``
    The state after token ``w``; :class:`ConstraintFailure` (with a cause) when the
    state cannot advance (an engine error).
``c.cheap_mask`` and ``c.masks(lm, states) -> (B, V) bool``
    The optional batched mask: ``masks[b, w]`` is ``allows(states[b], w)`` for ordinary
    tokens and ``ends(states[b])`` for every id in ``lm.eos_token_ids``, for all particles
    at once, on ``lm.device``. ``cheap_mask`` says whether it is cheap (tensor operations,
    an engine call); the default checks tokens (listed on a trie: ``text_check``).
``c.forced(lm, state) -> int | None``
    Optional: the one token allowed next, when exactly one (not EOS) is.
``c.reachable(lm, state, tokens_left) -> bool``
    Optional: False when no completion of at most ``tokens_left`` more tokens (the end
    token included) can pass the complete check, so the particle ends now instead of
    walking into a dead end a count makes certain (default True: no budget reasoning).
``c.need(lm, state) -> int``, ``c.missing(lm, state) -> int``, ``c.hint(lm, state)``
    Optional guides, never changing the target: a sound lower bound on the tokens (end
    included) any passing completion still needs (``need_twist``); how many given targets
    (a word at a position, each word of a paragraph's required last sentence, a sentence
    a count's floor lacks) the prefix has not yet certainly met (``target_twist``); tokens
    that write what the constraint asks for next, which the lazy proposal may draw with an
    exact weight (``hint_prob``). Defaults: 0, 0, ``()``.
``c.budget_mask(lm, state, tokens_left) -> (V,) bool | None``
    Optional: a superset of the tokens ``w`` after which ``reachable(lm, state·w,
    tokens_left - 1)`` may hold (end tokens True), or None for "any token" (the default).
    A draw may leave the other tokens out unchecked: they lead to certain failure.
``c.text_check(lm, state)``, ``c.prefix_closed``
    The prefix check on the state's text followed by any string, when the constraint
    declares that its check is closed under prefixes (``prefix_closed = True``: a rejected
    text has no accepted extension), so the vocabulary's trie may be pruned on character
    prefixes (:mod:`~llamppl.decoding.proposals.vocab_trie`). Undeclared (the default), every token's
    whole text is checked, as the sampling formulation does.

**String verdicts.** Every constraint and every conjunction judges a text with no LM:
``c.accepts_prefix(text)`` (can it still be completed? False for a dead end) and
``c.accepts_end(text)`` (may the text end here?). They give the verdict of the token-level
walk above on any token string that spells the text (the walk asks ``allows`` at each token
boundary, then ``ends``): a text constraint answers with its own prefix and complete checks
(the walk's last step; the earlier steps agree when the prefix check is closed under prefixes,
as "can it still be completed?" is), a grammar with the engine's byte-level walk
(:mod:`~llamppl.decoding.grammar.strings`), :func:`~llamppl.constraints.canonical` with the
walk of the tokenizer's own spelling of the text, a conjunction with every part, and any
other constraint with its own state with the walk of the text one character per token
(:func:`walk_characters`)::

    c = max_word_length(5) & banned_words(["rates"])
    c.accepts_prefix("The Fed ra"), c.accepts_end("The Fed says rates")   # (True, False)

**Text constraints.** :class:`Constraint` itself is the text constraint: its state is
the generated text ``s`` (the concatenation of ``lm.vocab[t]`` over the generated
tokens, so appending ``w`` appends exactly ``lm.vocab[w]``), and a subclass answers on
text only: ``constraint(s) -> bool`` (in C?), ``constraint.accepts_end(s) -> bool`` (in
C_F? default ``constraint(s)``) and, for speed, ``constraint.allowed_mask(lm, s)``
(the ``(V,)`` mask; overriding it makes ``cheap_mask`` true). The ready-made ones
(:func:`max_word_length`, :func:`banned_words`, :func:`regex_prefix`, in
:mod:`~llamppl.decoding.text.characters`) are such subclasses.

**A plain callable** ``f(text) -> bool`` becomes a :class:`PredicateConstraint` (prefix
and complete check both ``f``, a function of the text alone: answers are remembered per
text), checked lazily on the tokens drawn (:mod:`~llamppl.decoding.proposals.lazy`) under
the time bound of :mod:`~llamppl.decoding.constraints.time_bound`. It is only ever asked about texts
made of whole tokens unless it is declared closed under prefixes
(``PredicateConstraint(f, prefix_closed=True)``), which lets a dead end be proved on the
vocabulary's trie with a few hundred checks instead of one per token.

**Composition.** ``a & b`` is :class:`AllOf`: allowed iff every part allows; its mask is
cheap iff every part's is, and a lazy draw masks with the cheap parts and checks the others
on the tokens it draws: ``max_word_length(5) & banned_words(["rates"])``. Each part answers
for itself, so a prefix every part accepts alone may still have no completion that passes
them all; ``c.implied(parts)`` lets a part name constraints the conjunction implies (same
target, tighter prefix checks), which :class:`AllOf` adds beside the given parts when it is
built (the text constraints of :mod:`~llamppl.decoding.text` use it for counts next to
positions, last words and required words, and for their plain characters).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from llamppl.decoding.constraints.mask_rows import finish_rows
from llamppl.decoding.constraints.time_bound import bounded_call
from llamppl.decoding.proposals.vocab_trie import vocab_trie
from llamppl.lm.base import LanguageModel
from llamppl.lm.memo import LRU

__all__ = [
    "Constraint",
    "ConstraintFailure",
    "PredicateConstraint",
    "AllOf",
    "as_constraint",
    "finish_rows",
    "may_list",
    "sound_listings",
    "walk_characters",
]

_SOUND_LISTINGS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "llamppl_sound_listings", default=True
)


@contextlib.contextmanager
def sound_listings(allowed: bool) -> Iterator[None]:
    """Whether, inside the block, a check that is only *sound* may be listed on the trie.

    A sound check (it rejects a text only when no completion of it passes the complete
    check; COLLIE's word checks) lists a subset of the tokens its scan accepts, leaving out
    only tokens after which no text can pass the complete check. That keeps the target
    exact when every final text faces the complete check, and not when cut texts are kept
    without it (``HardConstraint(truncated="keep")``, which lists closed checks only).
    """
    token = _SOUND_LISTINGS.set(bool(allowed))
    try:
        yield
    finally:
        _SOUND_LISTINGS.reset(token)


def may_list(c: Constraint) -> bool:
    """Whether ``c.text_check`` may prune the trie here: a closed check always, a sound one
    unless :func:`sound_listings` forbids it."""
    return c.prefix_closed or _SOUND_LISTINGS.get()


class ConstraintFailure(Exception):
    """A constraint's state cannot advance; ``cause`` names why (the particle's failure)."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class Constraint:
    """A hard constraint (see the module docstring); by default a constraint on the text.

    Subclass it for a text constraint: implement :meth:`__call__` and, if the end of
    the string is special, :meth:`accepts_end`, and for speed :meth:`allowed_mask`.
    Override :meth:`start`, :meth:`allows`, :meth:`ends`, :meth:`advance` and
    :meth:`masks` for a constraint with its own state (as grammars do). Constraint
    objects are immutable: cloning a particle shares them.
    """

    #: A promise of the subclass: the prefix check is closed under prefixes (it rejects every
    #: extension of a text it rejects, as "can this still be completed?" does). Only then do
    #: :meth:`text_check`, the default mask and the lazy draw's listing prune the vocabulary's
    #: trie on character prefixes (:mod:`~llamppl.decoding.proposals.vocab_trie`). False by default: a
    #: check that rejects "…x" but accepts "…xy" must not lose the token "xy".
    prefix_closed: bool = False

    # ------------------------------------------------------------ text interface
    def __call__(self, text: str) -> bool:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(text)")

    @property
    def judges_text(self) -> bool:
        """Whether the subclass implements the text interface (``__call__``)."""
        return type(self).__call__ is not Constraint.__call__

    def accepts_prefix(self, text: str) -> bool:
        """Whether ``text`` can still be completed into a text this constraint accepts (False
        for a dead end), as the token-level walk judges it (module docstring, "String
        verdicts"): the prefix check ``self(text)`` for a text constraint, else the walk of
        ``text`` one character per token (:func:`walk_characters`)."""
        if self.judges_text:
            return bool(self(text))
        return walk_characters(self, text)[0]

    def accepts_end(self, text: str) -> bool:
        """Whether the string may end (be followed by EOS) after ``text``: the complete check.

        The default is the prefix check (a text constraint whose end is not special); a
        constraint with its own state and no text interface answers with the walk of
        ``text`` one character per token (:func:`walk_characters`).
        """
        if self.judges_text:
            return bool(self(text))
        return walk_characters(self, text)[1]

    def allowed_mask(self, lm: LanguageModel, text: str) -> torch.Tensor:
        """``(V,)`` bool: which next tokens keep ``text`` in the set C, listed on the vocabulary's
        trie when the check is closed under prefixes (:meth:`text_check`), else token by token."""
        mask = torch.zeros(lm.vocab_size, dtype=torch.bool)
        if bounded_call(self, text):
            check = self.text_check(lm, text) if may_list(self) else None
            if check is None:
                mask = torch.tensor([bool(bounded_call(self, text + t)) for t in lm.vocab])
            else:
                mask[vocab_trie(lm, lm.eos_token_ids).allowed(check)[0]] = True
            mask[list(lm.eos_token_ids)] = bool(bounded_call(self.accepts_end, text))
        return mask.to(lm.device)

    # ------------------------------------------------------------ the protocol
    @property
    def cheap_mask(self) -> bool:
        """Whether :meth:`masks` is cheap: true when a subclass vectorised ``allowed_mask``."""
        return type(self).allowed_mask is not Constraint.allowed_mask

    def start(self, lm: LanguageModel) -> Any:
        """The state before any generated token: the empty text."""
        return ""

    def allows(self, lm: LanguageModel, state: Any, token: int) -> bool:
        """Prefix check: ``state + lm.vocab[token]`` in C (memoised: :meth:`checked`)."""
        return self.checked(False, state + lm.vocab[token])

    def ends(self, lm: LanguageModel, state: Any) -> bool:
        """Complete check: the text may end here (memoised)."""
        return self.checked(True, state)

    def checked(self, end: bool, text: str) -> bool:
        """The complete check (``end``) or the prefix check of ``text``, under the time bound,
        remembered per constraint object.

        Particles cloned at resampling ask the same questions; a text constraint is a
        function of the text, so each text is checked once (an LRU of 65,536 answers shared
        by every particle, since particles share the constraint object).
        """
        memo = self.__dict__.get("_memo")
        if memo is None:
            memo = self.__dict__["_memo"] = LRU(65_536)
        key = (end, text)
        found = memo.get(key)
        if found is None:
            found = bool(bounded_call(self.accepts_end if end else self, text))
            memo.put(key, found)
        return found

    def text_check(self, lm: LanguageModel, state: Any) -> Callable[[str], bool] | None:
        """``check(x)``: the prefix check of the state's text followed by any string ``x``
        (memoised), for :mod:`~llamppl.decoding.proposals.vocab_trie`; None for a state that is not
        text, an overridden ``allows``, or ``prefix_closed`` false. A subclass whose check
        is sound but not closed may return it (:func:`sound_listings`)."""
        if self.prefix_closed and isinstance(state, str) and type(self).allows is Constraint.allows:
            return lambda x: self.checked(False, state + x)
        return None

    def advance(self, lm: LanguageModel, state: Any, token: int) -> Any:
        """The text after ``token``."""
        return state + lm.vocab[token]

    def masks(self, lm: LanguageModel, states: Sequence[Any]) -> torch.Tensor:
        """``(B, V)`` bool masks of the tokens each state allows next (EOS: the complete check)."""
        return torch.stack([self.allowed_mask(lm, s) for s in states])

    def masked_probs(
        self,
        lm: LanguageModel,
        states: Sequence[Any],
        log_probs: torch.Tensor,
        ends: torch.Tensor,
        end_ids: list[int],
        final: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The masked proposal of a batch: ``q = p ⊙ mask`` ``(B, V)`` and ``log Σ_w q`` ``(B,)``.

        ``log_probs`` is ``(B, V)``; the end tokens ``end_ids`` are allowed where ``ends``
        (``(B,)`` bool, the complete check); rows with ``final`` keep only end tokens
        (:func:`finish_rows`). One multiplication applies the masks.
        """
        masks = finish_rows(self.masks(lm, states).to(log_probs.dtype), ends, end_ids, final)
        q = log_probs.exp() * masks  # (B, V)
        return q, q.sum(dim=-1).log()

    def end_failure(self, lm: LanguageModel, state: Any) -> str | None:
        """Why the text may not end here when the prefix looks complete (None: no detail)."""
        return None

    def reachable(self, lm: LanguageModel, state: Any, tokens_left: int) -> bool:
        """Whether a completion within ``tokens_left`` tokens (end included) may pass (sound:
        True unless it is certain that none can)."""
        return True

    def need(self, lm: LanguageModel, state: Any) -> int:
        """Fewest more tokens (end token included) any passing completion needs: a sound lower
        bound, 0 when unknown (the default). ``HardConstraint``'s ``need_twist`` reads it."""
        return 0

    def missing(self, lm: LanguageModel, state: Any) -> int:
        """How many given targets the prefix has not yet certainly met (0 when the constraint
        names none, the default). ``HardConstraint``'s ``target_twist`` reads it."""
        return 0

    def hint(self, lm: LanguageModel, state: Any) -> tuple[int, ...]:
        """Tokens that write what the constraint asks for next (the first token of a required
        word when it is due), or ``()`` (the default). A suggestion, never a restriction:
        ``HardConstraint``'s lazy proposal draws among the allowed ones with probability
        ``hint_prob`` and weights the draw exactly (``models/hard_constraints.py``)."""
        return ()

    def budget_mask(self, lm: LanguageModel, state: Any, tokens_left: int) -> torch.Tensor | None:
        """``(V,)`` bool: a superset of the tokens after which the constraint stays reachable in
        ``tokens_left - 1`` tokens (end tokens True); None: every token may be (the default)."""
        return None

    def forced(self, lm: LanguageModel, state: Any) -> int | None:
        """The one token allowed next, if exactly one (not EOS) is; None when unknown."""
        return None

    def text_of(self, lm: LanguageModel, state: Any) -> str:
        """The text a state stands for (for failure messages and display)."""
        return state

    # ------------------------------------------------------------ composition
    def implied(self, parts: Sequence[Constraint]) -> list[Constraint]:
        """Constraints that the conjunction of ``parts`` (this one among them) implies, for
        :class:`AllOf` to add beside them: each one's complete check holds on every text that
        passes every part's complete check, and its prefix check is sound for its own complete
        check, so adding it leaves the target unchanged while its prefix check, budget and
        guides may reason about the parts *together* (``word_count(exactly=8) &
        last_word_of_sentences(["ocean"])`` refuses ``"... with the"`` at once: the 8th word
        can no longer be "ocean"). Default: none."""
        return []

    def __and__(self, other: object) -> AllOf:
        return AllOf(self, as_constraint(other, "other"))

    def __rand__(self, other: object) -> AllOf:
        return AllOf(as_constraint(other, "other"), self)

    def __deepcopy__(self, memo: dict) -> Constraint:
        return self

    def state_key(self) -> tuple:
        return ("constraint", id(self))


class PredicateConstraint(Constraint):
    """Wraps a plain ``fn(text) -> bool``: the prefix check is ``fn``, the complete check is
    ``complete`` when given, else ``fn`` too.

    No cheap mask: a program checks it lazily on the tokens it draws. Calls are counted in
    ``calls``. By default ``fn`` is only ever called on texts made of whole tokens, which is
    exact for any ``fn``. ``prefix_closed=True`` declares that ``fn`` is false on every
    extension of a text it rejects (as "can this still be completed?" is); the vocabulary's
    trie is then pruned on character prefixes, so a dead end costs a few hundred calls
    instead of one per token. A false declaration changes the target.

    String verdicts: ``accepts_prefix(text)`` is ``fn(text)`` and ``accepts_end(text)`` the
    complete check (with ``fn(text)`` for a non-empty text). A token-level walk asks ``fn``
    at every token boundary, so when ``fn`` is closed under prefixes the verdicts are the
    walk's on every spelling of the text. When it is not declared so, ``fn(text)`` is the
    verdict of the walk's last step only: a walk that wrote ``text`` in tokens also passed
    ``fn`` on the texts at the earlier boundaries, which this verdict does not ask; it is
    the walk's verdict for the spellings whose earlier boundaries ``fn`` accepts.
    """

    def __init__(
        self,
        fn: Callable[[str], bool],
        prefix_closed: bool = False,
        complete: Callable[[str], bool] | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"predicate must be callable (text -> bool), got {type(fn).__name__}")
        if not isinstance(prefix_closed, bool):
            raise TypeError(f"prefix_closed must be a bool, got {type(prefix_closed).__name__}")
        if complete is not None and not callable(complete):
            raise TypeError(
                f"complete must be callable (text -> bool) or None, got {type(complete).__name__}"
            )
        self.fn = fn
        self.complete = complete
        self.calls = 0
        self.prefix_closed = prefix_closed

    def __call__(self, text: str) -> bool:
        self.calls += 1
        return bool(self.fn(text))

    def accepts_end(self, text: str) -> bool:
        """The complete check: ``complete(text)`` when one was given, else ``fn(text)`` (the
        prefix check alone: a text is accepted when it may still be completed).

        With ``complete``, a non-empty text must also pass ``fn``, as every text a walk
        reaches has (asked through the memo of :meth:`~Constraint.checked`, which the walk
        filled at the text's last token: no second call there).
        """
        if self.complete is None:
            return self(text)
        if text and not self.checked(False, text):
            return False
        self.calls += 1
        return bool(self.complete(text))

    @property
    def prefix_only(self) -> bool:
        """Whether finished texts are judged by the prefix check alone (no ``complete``)."""
        return self.complete is None and type(self).accepts_end is PredicateConstraint.accepts_end

    def __repr__(self) -> str:
        return f"PredicateConstraint({getattr(self.fn, '__name__', self.fn)!r})"


class AllOf(Constraint):
    """Conjunction: allowed iff every part allows it; the state is the tuple of the parts' states.

    ``given`` are the parts the user composed (a nested conjunction is flattened into its own
    given parts); ``implied_parts`` are the constraints the given parts imply together
    (:meth:`Constraint.implied`, asked of every given part when the conjunction is built;
    duplicates by ``repr`` dropped, recomputed whenever conjunctions nest; ``imply=False``
    asks nothing, so the text builders' plain characters are left out too); ``parts`` is both,
    given first, and every check runs over it. An implied part holds on every text of the target,
    so it only refuses, earlier, prefixes that no such text extends (the text builders'
    plain characters are the one implied part that belongs to the target by definition:
    :mod:`~llamppl.decoding.text.plain`). ``repr`` shows the given parts.
    ``cheap_parts`` / ``costly_parts`` split the parts by ``cheap_mask``: a lazy draw masks
    with the cheap ones and checks the costly ones on the tokens it draws. Checks run cheap
    parts first, so a costly predicate sees only what the cheap parts allow.
    """

    def __init__(self, *parts: object, imply: bool = True) -> None:
        if not parts:
            raise ValueError("AllOf needs at least one constraint")
        if not isinstance(imply, bool):
            raise TypeError(f"imply must be a bool, got {type(imply).__name__}")
        given: list[Constraint] = []
        for p in parts:
            c = as_constraint(p, "parts")
            given += list(c.given) if isinstance(c, AllOf) else [c]
        self.given, self.imply = tuple(given), imply
        seen = {repr(p) for p in given}
        implied: list[Constraint] = []
        for p in given if imply else ():
            for q in p.implied(self.given):
                if repr(q) not in seen:
                    seen.add(repr(q))
                    implied.append(as_constraint(q, "implied"))
        self.implied_parts = tuple(implied)
        self.parts = self.given + self.implied_parts
        order = sorted(range(len(self.parts)), key=lambda i: not self.parts[i].cheap_mask)
        self._order = tuple(order)  # cheap parts first

    @property
    def cheap_mask(self) -> bool:
        return all(p.cheap_mask for p in self.parts)

    @property
    def prefix_closed(self) -> bool:  # type: ignore[override]
        """Closed under prefixes iff every part is (an intersection of closed sets is)."""
        return all(p.prefix_closed for p in self.parts)

    @property
    def cheap_parts(self) -> tuple[int, ...]:
        return tuple(i for i in self._order if self.parts[i].cheap_mask)

    @property
    def costly_parts(self) -> tuple[int, ...]:
        return tuple(i for i in self._order if not self.parts[i].cheap_mask)

    # text interface (every part a text constraint)
    def __call__(self, text: str) -> bool:
        return all(self.parts[i](text) for i in self._order)

    def accepts_prefix(self, text: str) -> bool:
        """Every part (implied parts included) can still complete ``text``."""
        return all(self.parts[i].accepts_prefix(text) for i in self._order)

    def accepts_end(self, text: str) -> bool:
        """Every part (implied parts included) lets the text end here."""
        return all(self.parts[i].accepts_end(text) for i in self._order)

    def allowed_mask(self, lm: LanguageModel, text: str) -> torch.Tensor:
        return self.masks(lm, [text])[0]

    # protocol
    def part_states(self, state: Any) -> tuple:
        """The parts' states: ``state`` itself, or for a text (a conjunction of text constraints,
        whose states are all the text) that text once per part, so ``c.hint(lm, "He ran")``
        works on a conjunction as on one text constraint."""
        return (state,) * len(self.parts) if isinstance(state, str) else state

    def start(self, lm: LanguageModel) -> tuple:
        return tuple(p.start(lm) for p in self.parts)

    def allows(self, lm: LanguageModel, state: Any, token: int) -> bool:
        state = self.part_states(state)
        return all(self.parts[i].allows(lm, state[i], token) for i in self._order)

    def ends(self, lm: LanguageModel, state: Any) -> bool:
        state = self.part_states(state)
        return all(self.parts[i].ends(lm, state[i]) for i in self._order)

    def advance(self, lm: LanguageModel, state: Any, token: int) -> Any:
        """The parts' states after ``token`` (a text again, when given a text that every part
        advances the same way)."""
        out = tuple(p.advance(lm, s, token) for p, s in zip(self.parts, self.part_states(state)))
        if isinstance(state, str) and all(isinstance(s, str) and s == out[0] for s in out):
            return out[0]
        return out

    def masks(self, lm: LanguageModel, states: Sequence[Any], parts=None) -> torch.Tensor:
        """The AND of the parts' masks (of ``parts``, indices, when given)."""
        idx = self._order if parts is None else parts
        states = [self.part_states(s) for s in states]
        out = self.parts[idx[0]].masks(lm, [s[idx[0]] for s in states]).clone()  # (B, V)
        for i in idx[1:]:
            out &= self.parts[i].masks(lm, [s[i] for s in states])
        return out

    def forced(self, lm: LanguageModel, state: Any) -> int | None:
        state = self.part_states(state)
        for i in self._order:
            token = self.parts[i].forced(lm, state[i])
            if token is not None:
                others = (j for j in self._order if j != i)
                if all(self.parts[j].allows(lm, state[j], token) for j in others):
                    return token
                return None
        return None

    def end_failure(self, lm: LanguageModel, state: Any) -> str | None:
        state = self.part_states(state)
        causes = (self.parts[i].end_failure(lm, state[i]) for i in self._order)
        return next((c for c in causes if c is not None), None)

    def reachable(self, lm: LanguageModel, state: Any, tokens_left: int) -> bool:
        states = self.part_states(state)
        return all(p.reachable(lm, s, tokens_left) for p, s in zip(self.parts, states))

    def need(self, lm: LanguageModel, state: Any) -> int:
        """The largest part's need (a completion must satisfy every part)."""
        return max(p.need(lm, s) for p, s in zip(self.parts, self.part_states(state)))

    def missing(self, lm: LanguageModel, state: Any) -> int:
        """The parts' missed targets, summed (each part names its own)."""
        return sum(p.missing(lm, s) for p, s in zip(self.parts, self.part_states(state)))

    def hint(self, lm: LanguageModel, state: Any) -> tuple[int, ...]:
        """Every part's hints, in order, once each."""
        states = self.part_states(state)
        return tuple(dict.fromkeys(h for p, s in zip(self.parts, states) for h in p.hint(lm, s)))

    def budget_mask(self, lm: LanguageModel, state: Any, tokens_left: int) -> torch.Tensor | None:
        """The AND of the parts' budget masks (None when no part restricts)."""
        out = None
        for p, s in zip(self.parts, self.part_states(state)):
            m = p.budget_mask(lm, s, tokens_left)
            if m is not None:
                out = m.clone() if out is None else out & m
        return out

    def text_of(self, lm: LanguageModel, state: Any) -> str:
        return self.parts[0].text_of(lm, self.part_states(state)[0])

    def __repr__(self) -> str:
        shown = " & ".join(map(repr, self.given))
        if self.imply:
            return shown
        return f"AllOf({', '.join(map(repr, self.given))}, imply=False)"


def as_constraint(
    predicate: object, name: str = "predicate", complete: Callable[[str], bool] | None = None
) -> Constraint:
    """``predicate`` itself if it is a :class:`Constraint`, else a :class:`PredicateConstraint`;
    with ``complete`` (a complete check of the finished text), a constraint whose complete check
    also asks it."""
    if not isinstance(predicate, Constraint) and not callable(predicate):
        raise TypeError(
            f"{name} must be callable (text -> bool) or a Constraint, got {type(predicate).__name__}"
        )
    if complete is None:
        return predicate if isinstance(predicate, Constraint) else PredicateConstraint(predicate)
    if isinstance(predicate, Constraint):
        return predicate & PredicateConstraint(_anything, prefix_closed=True, complete=complete)
    return PredicateConstraint(predicate, complete=complete)


def _anything(text: str) -> bool:
    return True


def walk_characters(c: Constraint, text: str) -> tuple[bool, bool]:
    """``(prefix, end)``: the token-level walk of ``text`` through ``c``, one character per
    token, on a :class:`~llamppl.FunctionLM` whose vocabulary is the text's characters:
    whether every character is allowed, and whether ``ends`` then holds (False when not)."""
    from llamppl.lm.function_lm import FunctionLM

    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    vocab = ["<s>", *sorted(set(text)), "</s>"]
    ids = {char: i for i, char in enumerate(vocab)}
    lm = FunctionLM(vocab, len(vocab) - 1, lambda ctx: [0.0] * len(vocab), bos_token_id=0)
    state = c.start(lm)
    for char in text:
        token = ids[char]
        if not c.allows(lm, state, token):
            return False, False
        state = c.advance(lm, state, token)
    return True, bool(c.ends(lm, state))
