"""``HardConstraint``: an LM continuation conditioned on a hard constraint, exactly.

LLaMPPL paper §2.2, "Hard constraints". Let p be the LM after the prompt x, C the
set of allowed prefixes of a constraint (:mod:`llamppl.decoding.constraints.protocol`: a
text constraint, a grammar, a user's Python predicate, or ``&`` of any of them)
and s_{t-1} the tokens generated so far. Three Feynman–Kac formulations, one
target:

``proposal="sample"`` — sample, then condition::

    M_t(s_{t-1} w | s_{t-1}) = p(w | x s_{t-1}),   G_t = 1_C(s_{t-1} w)

``proposal="mask"`` — token masking with the allowed mass as potential::

    M'_t(s_{t-1} w | s_{t-1}) = p(w | x s_{t-1}) 1_C(s_{t-1} w) / G'_t
    G'_t(s_{t-1}, s_t)        = Σ_w p(w | x s_{t-1}) 1_C(s_{t-1} w)

``proposal="lazy"`` — the masked proposal M'_t drawn by adaptive rejection,
checking only the tokens drawn, with an unbiased estimate Ẑ of G'_t as the
weight (:mod:`llamppl.decoding.proposals.lazy`, whose docstring proves that the
pair (token, Ẑ) is properly weighted: E[Ẑ f(w)] = Σ_w p(w) 1_C(s w) f(w)).

Since M'_t G'_t = M_t G_t token by token (and the lazy pair has the same
expectation), all three define the same posterior and the same Z. The mask needs
the constraint on every token of the vocabulary; it is the right choice when the
constraint has a cheap batched mask (grammars, the ready-made text constraints).
The lazy proposal is the right choice for a costly check (a chemistry parser, a
type checker): ``proposal="auto"`` (the default) picks the mask when
``constraint.cheap_mask`` and the lazy proposal otherwise. For ``cheap & costly``
the lazy draw masks with the cheap parts and checks only the costly ones. Each
formulation is an object behind one interface (:mod:`.constraint_formulations`);
the program holds the state, the endings, the budget and the twists.

**Endings.** A particle ends at EOS, and with ``stop="newline"`` also at any token
that contains a newline (the rule of the AWRS paper's molecule and pattern tasks):
such a token ends the text like EOS, its characters are not part of it, and it is
allowed iff the complete check accepts the text. After ``max_tokens`` generated
tokens (the end token included) the text is cut; what happens to a cut text is
``truncated``:

- ``"check"`` (the default): it is kept iff the complete check accepts it, as if it
  ended there (G = 1_{C_F}(s)); a text that only a prefix check admits, such as half a
  molecule, gets weight 0 with the cause ``"token limit"``;
- ``"drop"``: every cut text gets weight 0 (only texts that ended by themselves, the
  LM's own EOS, are in the posterior); at the last position only end tokens are allowed
  (and proposed), weighted by the LM's probability of ending there, and a text ended so
  says ``ending == "forced end"``;
- ``"keep"``: every cut text whose prefixes are all in C is kept (LLaMPPL's behaviour;
  for prefix-closed constraints such as ``max_word_length`` this equals ``"check"``).

The posterior over final texts s is therefore ``P(s) ∝ p(s | x) ∏_t 1_C(s_{1:t}) ·
E(s)`` with E(s) the complete check for ended texts and the ``truncated`` rule for
cut ones, and Z is the probability that the LM's output (cut at ``max_tokens``)
passes. A particle of weight 0 names why in ``failure`` (``"no allowed token"``,
``"token limit"``, ``"check timed out ..."``, ``"schema check: ..."``, ...).

**Guiding particles toward an ending.** ``end_twist``, ``need_twist``, ``target_twist``: the
twist of :mod:`llamppl.decoding.constraints.twists`, undone at the end (posterior and Z
unchanged); ``twist=`` adds a program's own log ψ to it, such as a learned twist
(:mod:`llamppl.inference.twist_learning`), undone the same way.

**Time bound.** Every check runs under ``check_timeout`` seconds, one lazy draw's checks
together under ten times that (:mod:`llamppl.decoding.constraints.time_bound`); past it the particle
gets weight 0 with the cause ``"check timed out ..."``, and the run goes on.

**Rejuvenation.** The program is a Feynman–Kac model like any other, so resample-move is the
engine's ``move=``: ``smc_standard(model, 8, move=ResampleMove(k=2))`` regenerates each
particle's last two tokens with the formulation's own proposal after resampling and accepts
by the ratio of the tails' weights (G', or the lazy draw's estimate of it, twists included),
which leaves the intermediate target invariant (:mod:`llamppl.inference.moves`; for the lazy
proposal it is a pseudo-marginal move, exact too). With ``ResampleMove(k, every_step=True)``
a move never changes the posterior or Z; moving only after resampling (the default) is
exact as N grows, with a bias at small N (measured in :mod:`llamppl.inference.moves`).

A text constraint sees the concatenation of ``lm.vocab[t]`` over the generated tokens
(end token excluded)::

    from llamppl import CachedCausalLM, run
    from llamppl.inference import smc_steer
    from llamppl.constraints import max_word_length
    from llamppl.models import HardConstraint
    lm = CachedCausalLM.default()
    model = HardConstraint(lm, "The Fed says", max_word_length(5), max_tokens=20)
    result = run(smc_steer(model, n_particles=8, n_beam=3, seed=0))
    print(result.log_ml, result.sample().text)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from llamppl.context import LMContext
from llamppl.decoding.constraints.protocol import (
    Constraint,
    ConstraintFailure,
    as_constraint,
    sound_listings,
)
from llamppl.decoding.constraints.time_bound import (
    DEFAULT_CHECK_TIMEOUT,
    CheckTimeout,
    check_timeout_seconds,
    time_bound,
)
from llamppl.decoding.constraints.twists import Twists, check_twist, twist_level
from llamppl.decoding.proposals.constrained_tokens import (
    end_token_ids,
    one_of,
)
from llamppl.lm.base import LanguageModel
from llamppl.modeling import Model
from llamppl.validation import check_positive_int, check_unit_interval, real_number

from .constraint_formulations import FORMULATIONS

__all__ = ["HardConstraint", "PROPOSALS", "STOPS", "TRUNCATED"]

PROPOSALS = ("auto", "mask", "lazy", "sample")
STOPS = ("eos", "newline")
TRUNCATED = ("check", "drop", "keep")


class HardConstraint(Model):
    """LM continuation of ``prompt`` in which every prefix satisfies a constraint.

    Parameters
    ----------
    lm : LanguageModel
    prompt : str | Sequence[int]
        Text or token ids to continue (``lm.bos_token_id`` is prepended as in ``LMContext``).
    predicate : Constraint | Callable[[str], bool]
        The constraint (:mod:`llamppl.decoding.constraints.protocol`): a ready-made one
        (``max_word_length(5)``), a grammar (``Grammar.from_regex(...)``), a plain
        callable on the text so far (prefix check and complete check), or ``a & b``.
    proposal : {"auto", "mask", "lazy", "sample"}
        The Feynman–Kac formulation (module docstring); same posterior, same Z. ``"auto"``
        is ``"mask"`` for a constraint with a cheap mask and ``"lazy"`` otherwise.
    max_tokens : int | None
        Generated tokens after which the text is cut (end token included); None: no limit
        (the LM must then end with probability one).
    stop : {"eos", "newline"}
        What ends a text: EOS, or also any token containing a newline.
    truncated : {"check", "drop", "keep"}
        What a text cut at ``max_tokens`` gets (module docstring).
    check_timeout : float | None
        Seconds one check may take (one lazy draw's checks: ten times that) before its
        particle dies (default 2); None: no bound.
    fast_forward : bool
        Take a token the constraint allows alone without a draw of its own (grammars;
        same target and weights, see :class:`~llamppl.models.GrammarConstraint`).
    end_twist : float
        Log-factor by which a live particle whose text passes the complete check is
        favoured (module docstring, "Guiding particles toward an ending"); 0 turns it off.
        Posterior and Z do not depend on it.
    need_twist : float
        Log-factor per token of the constraint's ``need`` (the fewest tokens a passing
        completion still needs; :meth:`~llamppl.decoding.constraints.protocol.Constraint.need`) by
        which a live particle is disfavoured: particles that make progress on what the
        constraint asks (copying a required sentence) are kept. A twist too; 0 turns it off.
    target_twist : float
        Log-factor per given target the prefix has not yet certainly met
        (:meth:`~llamppl.decoding.constraints.protocol.Constraint.missing`: a required word not yet
        at its position, each word of a paragraph's required last sentence not yet copied)
        by which a live particle is disfavoured, so the particle that pays the LM's price
        for writing a required word is not outweighed by those that put it off. A twist
        too; the default 8 is about what a required word costs SmolLM2 at its position; 0
        turns it off.
    complete : Callable[[str], bool] | None
        The complete check of a finished text, when ``predicate`` is the prefix check only
        (``HardConstraint(lm, prompt, prefix_ok, complete=done)``): a text ends (at an end
        token, or cut at ``max_tokens`` under ``truncated="check"``) only if ``done(text)``.
        Without it a plain callable is both checks, and the result notes that finished texts
        were accepted by the prefix check alone.
    hint_prob : float
        Probability, in [0, 1), with which the lazy proposal draws among the constraint's
        allowed hints (:meth:`~llamppl.decoding.constraints.protocol.Constraint.hint`: the first
        token of a word required at the position being written, the next token of a
        paragraph's required last sentence) when there are any; the weight accounts for
        it exactly (:mod:`~llamppl.decoding.proposals.lazy`, "Hints"). 0 turns hints off;
        constraints without hints are unaffected.
    twist : Callable[[HardConstraint], float | Awaitable[float]] | None
        A twist of one's own: log ψ of a live particle's prefix (a finite number, or an
        awaitable of one), added to the hand-weighted terms above after every step and undone
        when the particle ends, so posterior and Z do not depend on it. A learned twist
        (:class:`~llamppl.inference.twist_learning.LearnedTwist`) or any callable; to use it
        alone set ``end_twist=need_twist=target_twist=0``.

    Attributes
    ----------
    context : LMContext
    state
        The constraint's state (the text so far, for a text constraint).
    text : str
        The generated text as the constraint sees it (no end token).
    checks : int
        Checks this particle (and its ancestors) made in lazy draws and sampling steps.
    forced : int
        Tokens taken as forced tokens.
    failure : str | None
        Why the particle got weight zero (None while alive).
    ending : str | None
        How the text finished: ``"end token"`` (EOS, or a newline under ``stop="newline"``,
        drawn among the other tokens), ``"forced end"`` (an end token at the last position
        under ``truncated="drop"``, where only end tokens are allowed), ``"cut"`` (at
        ``max_tokens``), None while it runs or after it died.
    """

    #: How failure causes name the constraint ("token outside the constraint").
    constraint_noun = "constraint"

    def __init__(
        self,
        lm: LanguageModel,
        prompt: str | Sequence[int],
        predicate: Constraint | Callable[[str], bool],
        proposal: str = "auto",
        max_tokens: int | None = 32,
        *,
        stop: str = "eos",
        truncated: str = "check",
        check_timeout: float | None = DEFAULT_CHECK_TIMEOUT,
        fast_forward: bool = True,
        end_twist: float = 2.0,
        need_twist: float = 0.5,
        target_twist: float = 8.0,
        hint_prob: float = 0.5,
        complete: Callable[[str], bool] | None = None,
        twist: Callable | None = None,
    ) -> None:
        super().__init__()
        one_of("proposal", proposal, PROPOSALS)
        self.stop = one_of("stop", stop, STOPS)
        self.truncated = one_of("truncated", truncated, TRUNCATED)
        # a check that is only sound may be listed unless cut texts skip the complete check
        self.sound_listings = self.truncated != "keep"
        if not isinstance(fast_forward, bool):
            raise TypeError(f"fast_forward must be a bool, got {type(fast_forward).__name__}")
        self.constraint = as_constraint(predicate, complete=complete)
        self.check_timeout = check_timeout_seconds("check_timeout", check_timeout)
        self.max_tokens = (
            None if max_tokens is None else check_positive_int("max_tokens", max_tokens)
        )
        if proposal == "auto":
            proposal = "mask" if self.constraint.cheap_mask else "lazy"
        self.proposal = proposal
        self.formulation = FORMULATIONS[proposal]  # how a token is drawn and weighted
        self.fast_forward = fast_forward
        self.twists = Twists.checked(
            end_twist, need_twist, target_twist, end_varies=not self.prefix_only
        )
        self.own_twist = check_twist(twist)
        hint_prob = real_number("hint_prob", hint_prob)  # 0-d tensors and NumPy scalars too
        self.hint_prob = check_unit_interval(
            "hint_prob", hint_prob, open_left=False, open_right=True
        )
        self.context = LMContext(lm, prompt)
        self.end_ids = end_token_ids(lm, self.stop)
        self.state = self.constraint.start(lm)
        self.checks = self.forced = 0
        self.failure = None
        self.ending = None  # "end token", "forced end" or "cut" once finished
        if isinstance(self.state, str):
            with time_bound(self.check_timeout):
                if not self.constraint(""):
                    raise ValueError(
                        "predicate('') is False: the empty continuation is not in C, so no "
                        "string can satisfy it"
                    )

    # ------------------------------------------------------------ one step
    async def step(self) -> None:
        with time_bound(self.check_timeout), sound_listings(self.sound_listings):
            try:
                await self._step()
            except CheckTimeout as exc:
                self.die(str(exc) or f"check timed out (over {self.check_timeout:g} s)")
            except ConstraintFailure as failure:
                self.die(failure.cause)

    async def _step(self) -> None:
        ctx, lm = self.context, self.context.lm
        ahead = None  # the next draw's log-probs, when the forced chain already read them
        if self.formulation.takes_forced and self.fast_forward:
            ahead = await self._take_forced()
        last = self.max_tokens is not None and len(ctx.generated) + 1 >= self.max_tokens
        only_end = last and self.truncated == "drop"
        left = None  # tokens left for a budgeted constraint (None: no budget reasoning)
        if self.max_tokens is not None and self.truncated != "keep":
            left = self.max_tokens - len(ctx.generated)
            if not self.constraint.reachable(lm, self.state, left):  # a count out of reach
                self.die("token limit: the constraint cannot be met in the tokens left")
                return
        token = await self.formulation.draw(self, ahead=ahead, only_end=only_end, left=left)
        if token is None:  # the particle died (its cause named)
            return
        self._after(token, last, only_end)
        if not self.done_stepping():
            await self._retwist()

    def _after(self, token: int, last: bool, only_end: bool) -> None:
        """Advance the state by ``token``; end (``only_end``: where only an end token could
        come) or cut the text."""
        lm = self.context.lm
        if token in self.end_ids:
            self.ending = "forced end" if only_end else "end token"
            self.finish()
            return
        self.state = self.constraint.advance(lm, self.state, token)
        if last:
            if self.truncated == "check" and not self.constraint.ends(lm, self.state):
                self.die("token limit")
                return
            self.ending = "cut"
            self.finish()

    async def _retwist(self) -> None:
        """Set the live particle's twist to log ψ of its prefix: the hand-weighted terms plus
        the program's own ``twist`` (the difference from the outstanding twist is scored)."""
        level, checks = self.twists.log_psi(self.constraint, self.context.lm, self.state)
        self.checks += checks
        if self.own_twist is not None:
            level += await twist_level(self.own_twist, self)
        if level != self.twist_amount:
            self.twist(level - self.twist_amount)

    def finish(self) -> None:
        """End the particle; its twist is undone (ψ = 1 on a final text)."""
        if self.twist_amount:
            self.untwist()
        super().finish()

    # ------------------------------------------------------------ forced tokens
    async def _take_forced(self):
        """Take the tokens the constraint allows alone from here, scoring their
        probabilities (the singleton steps' G' = p(f)); one batched LM round for the chain
        and the next draw, whose ``(V,)`` log-probs it returns (every particle reads its row
        the same way, so their mask requests meet in one round)."""
        ctx, lm, c = self.context, self.context.lm, self.constraint
        room = None if self.max_tokens is None else self.max_tokens - len(ctx.generated)
        chain: list[int] = []
        while room is None or len(chain) + 1 < room:  # never the last budget position
            token = c.forced(lm, self.state)
            if token is None or token in self.end_ids:  # an end token is drawn, never forced
                break
            chain.append(token)
            self.state = c.advance(lm, self.state, token)
        # the chain's k distributions and the next draw's in ONE batched round (the trie runs
        # the k new tokens in the forward of the other particles' tokens)
        paths = [ctx.tokens + chain[:i] for i in range(len(chain) + 1)]
        *rows, ahead = await asyncio.gather(*(lm.next_token_logprobs(p) for p in paths))
        if chain:
            self.score(sum(float(lp[f]) for lp, f in zip(rows, chain)))  # G' of each singleton
            for f in chain:
                ctx.extend(f)
            self.forced += len(chain)
        return ahead

    # ------------------------------------------------------------ outcomes
    def count_check(self) -> None:
        """Count one check of this particle's constraint (a formulation's draw calls it)."""
        self.checks += 1

    def end_cause(self) -> str:
        """Why no token is allowed here (the constraint's end failure, when it names one)."""
        return self.constraint.end_failure(self.context.lm, self.state) or "no allowed token"

    def die(self, cause: str) -> None:
        """Weight zero, with ``cause`` as the particle's :attr:`failure`."""
        self.failure = cause
        self.condition(False)

    @property
    def text(self) -> str:
        """The generated text as the constraint sees it (no end token)."""
        return self.constraint.text_of(self.context.lm, self.state)

    @property
    def prefix_only(self) -> bool:
        """Whether finished texts are accepted by the prefix check alone (a plain callable
        given without ``complete=``): then a text that may still be completed counts as done."""
        return bool(getattr(self.constraint, "prefix_only", False))

    def string_for_serialization(self) -> str:
        """The posterior key: the generated text as the constraint sees it (:attr:`text`, no
        end token); :attr:`ending` tells an ended text from a cut one or a forced end."""
        return self.text
