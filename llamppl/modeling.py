"""``Model``: the base class of language model probabilistic programs.

Subclass it and write ``step``. Each call of ``step`` is one time step of a
Feynman–Kac model (LLaMPPL paper §2.3): the transition M_t is ``step`` with
every ``sample`` drawn from its proposal and ``observe``/``condition`` ignored;
the potential G_t is the product of everything the call scores::

    G_t = ∏ p(v)/q(v)  [sample with proposal q]  · ∏ p(y)  [observe]
          · ∏ 1[cond]  [condition]                · ∏ exp(a) [twist]

All four reduce to :meth:`Model.score` on the particle's log ``weight``::

    class NoLongWords(Model):
        def __init__(self, lm, prompt):
            super().__init__()
            self.context = LMContext(lm, prompt)
        async def step(self):
            token = await self.sample(self.context.next_token())
            self.condition(all(len(w) <= 5 for w in str(self.context).split()))
            if token in self.context.lm.eos_token_ids:
                self.finish()

A plain ``def step(self)`` whose ``self.sample`` returns the value directly
works too; it runs in a greenlet so that all particles' LM requests are still
batched into one forward pass.

Arguments are checked where they enter: a score (``score``, ``twist``, a
distribution's ``log_prob``) must be a real number — Python, NumPy or a 0-d real
tensor, never ``bool`` or a string — and a condition a bool-like (Python/NumPy
bool, 0-d bool tensor), never a number or a string; anything else is a
``TypeError`` naming the argument (:mod:`llamppl.validation`). In an
``async def step`` every ``sample`` / ``observe`` / ``call`` / ``intervene`` must
be awaited; one left unawaited is a ``TypeError`` at the end of the step
(:mod:`llamppl.awaiting`).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
from collections.abc import Awaitable, Iterator
from typing import Any

import numpy as np

from .awaiting import awaits_checked, expect_await
from .context import LMContext
from .distributions import Distribution
from .validation import bool_like, real_number

__all__ = ["Model", "ParticleDead", "state_key", "TWIST_LIMIT"]

#: The largest |twist| in nats (:meth:`Model.twist`), for one twist and for the twists not yet
#: undone. A twist a is added to the weight w and later subtracted; each operation rounds to
#: float64, whose spacing below 2^20 (> 10^6) is at most 2^-33 ≈ 1.2e-10, so a twist and its
#: undo leave w changed by at most ~1.2e-10 nats: thousands of times below the precision of
#: the weights themselves (log-probabilities of float32 logits, ~1e-6 nats; a cached forward
#: agrees with a fresh one to 1e-4). Beyond it the error grows with |a|: at 10^17 the spacing
#: is 16 nats, and w + a − a returns 0 whatever w was. No useful potential comes near 10^6
#: nats (a likelihood ratio of e^1000000).
TWIST_LIMIT = 1e6


class ParticleDead(BaseException):
    """Raised inside ``step`` when a particle with weight -inf samples again; ends its step."""


def _await_from_greenlet(awaitable: Awaitable) -> Any:
    import greenlet

    parent = greenlet.getcurrent().parent
    if parent is None:
        raise RuntimeError(
            "a plain `def step` must be run by an inference algorithm (or `await model.run_step()`)"
        )
    return parent.switch(awaitable)


class Model:
    """Base class for language model probabilistic programs (see the module docstring).

    Attributes
    ----------
    weight : float
        The particle's log importance weight (``-inf`` after a failed condition).
    finished : bool
        Set by :meth:`finish`; a finished particle is not stepped again.

    Notes
    -----
    Users write ``step`` (and optionally ``start``, ``string_for_serialization``,
    ``immutable_properties``). Inference engines use only this public interface:

    - :meth:`run_start` / :meth:`run_step` run the ``start`` / ``step`` hook once
      (plain or async, a dead particle's step ending early, unawaited primitives
      caught);
    - :meth:`clone`, :meth:`done_stepping`, :meth:`state_key`, and the attributes
      ``weight`` (read, and set after resampling) and ``finished``;
    - :meth:`replaying` makes every ``sample`` ask a chooser for its value
      (``enumerate_exact`` visits every path this way, ``csmc_standard`` records
      the free particles' choices and forces the reference's).

    Sub-programs (:class:`~llamppl.SubModel`) score into their caller through
    :meth:`sample_async`, :meth:`observe_async` and :meth:`intervene_async`, the
    awaitable forms of the primitives whatever the kind of the caller's ``step``.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Model:
        self = super().__new__(cls)
        # Bookkeeping exists even if a subclass forgets super().__init__().
        self.weight = 0.0
        self.finished = False
        self._sync = False
        self._chooser = None
        self._twist_amount = 0.0
        self._failure = None
        self._ending = None
        return self

    def __init__(self) -> None:
        pass

    # ------------------------------------------------------------------ user hooks
    async def start(self) -> None:
        """Optional: run once per particle before the first ``step``."""

    async def step(self) -> None:
        """One Feynman–Kac time step; subclasses must implement it (async or plain)."""
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def string_for_serialization(self) -> str:
        """Display and posterior key of the particle.

        Default: the generated text if the model holds exactly one ``LMContext``,
        otherwise its public attributes.
        """
        state = {
            k: v
            for k, v in vars(self).items()
            if not k.startswith("_") and k not in ("weight", "finished")
        }
        contexts = [v for v in state.values() if isinstance(v, LMContext)]
        if len(contexts) == 1:
            return str(contexts[0])
        if len(state) == 1:
            return str(next(iter(state.values())))
        return ", ".join(f"{k}={v}" for k, v in state.items())

    # ------------------------------------------------------------------ primitives
    def score(self, log_w: float) -> None:
        """Multiply the particle's weight by ``exp(log_w)``. All other primitives reduce to this.

        ``log_w`` must be a real number (Python, NumPy, or a 0-d real tensor), ``-inf``
        allowed; a bool, a string or a tensor with elements is a ``TypeError``.
        """
        self._add_score(log_w, "score(log_w)")

    def _add_score(self, log_w: object, name: str) -> None:
        log_w = real_number(name, log_w)
        if math.isnan(log_w):
            raise ValueError(f"{name} got NaN; log weights may be -inf but never NaN")
        if log_w == math.inf:
            raise ValueError(f"{name} got +inf")
        if self.weight != -math.inf:
            self.weight += log_w
            if log_w == -math.inf and self._failure is None:
                self._failure = f"{name} is -inf"

    def sample(self, dist: Distribution, proposal: Distribution | None = None):
        """Draw from ``proposal`` (default ``dist``) and score ``dist(v) / proposal(v)``.

        ``await`` it in an ``async def step``; in a plain ``def step`` it returns the value.
        """
        return self._primitive("sample", self.sample_async(dist, proposal))

    def observe(self, dist: Distribution, value: Any):
        """Score ``dist.log_prob(value)`` (a likelihood term of G_t)."""
        return self._primitive("observe", self.observe_async(dist, value))

    def condition(self, ok: bool) -> None:
        """Hard constraint: the weight becomes -inf (the particle stops) if ``ok`` is false.

        ``ok`` must be a bool-like (Python or NumPy bool, 0-d bool tensor); a number,
        a string or a tensor with several elements is a ``TypeError``.
        """
        if not bool_like("condition(ok)", ok):
            if self.weight != -math.inf and self._failure is None:
                self._failure = "condition"
            self.weight = -math.inf

    @property
    def failure(self) -> str | None:
        """Why the particle's weight became zero (None while it is positive): ``"condition"``,
        ``"<what> is -inf"`` for a score, or the cause a program names (``HardConstraint``:
        ``"token limit"``, ``"no allowed token"``, ``"check timed out ..."``). Runs count the
        causes (``SMCResult.failures``)."""
        return self._failure

    @failure.setter
    def failure(self, cause: str | None) -> None:
        self._failure = cause

    @property
    def ending(self) -> str | None:
        """How a finished particle's text finished: ``"end token"`` (its LM ended it),
        ``"forced end"`` (an end token where the program allowed nothing else, at a token
        limit: ``HardConstraint(truncated="drop")``) or ``"cut"`` (the program stopped it, at a
        token limit); None while it runs, when it died, or when the program has no single
        ``LMContext`` to tell. Programs may set it (``HardConstraint`` does); results mark cut
        texts and forced ends (``SMCResult``), run records store it."""
        if self._ending is not None or not self.finished or self.weight == -math.inf:
            return self._ending
        contexts = [v for v in vars(self).values() if isinstance(v, LMContext)]
        if len(contexts) == 1:
            return "end token" if contexts[0].finished else "cut"
        return None

    @ending.setter
    def ending(self, how: str | None) -> None:
        self._ending = how

    def twist(self, amount: float) -> None:
        """Add an intermediate potential ``amount`` (undo it later with ``twist(-amount)`` or :meth:`untwist`).

        ``amount`` is a log-potential in nats: a real number within ±:data:`TWIST_LIMIT`
        (10^6), or ``-inf`` (a potential of zero), and the twists not yet undone must stay
        within that range too; beyond it a ``ValueError`` (see :data:`TWIST_LIMIT`).
        """
        amount = real_number("twist(amount)", amount)
        pending = self._twist_amount + amount
        if pending != -math.inf and not (abs(amount) <= TWIST_LIMIT >= abs(pending)):
            raise ValueError(
                f"twist(amount) must lie within ±{TWIST_LIMIT:.0e} nats, and so must the twists not "
                f"yet undone (float64 undoes a twist exactly to about 1e-10 nats only up to "
                f"there); got amount={amount!r}, pending twists would total {pending!r}"
            )
        self._add_score(amount, "twist(amount)")
        self._twist_amount = pending

    @property
    def twist_amount(self) -> float:
        """The sum of the twists not yet undone (what :meth:`untwist` would remove)."""
        return self._twist_amount

    def untwist(self) -> None:
        """Undo every twist not yet undone: ``score(-Σ amounts)`` (never automatic here)."""
        amount, self._twist_amount = self._twist_amount, 0.0
        self.score(-amount)

    def call(self, sub):
        """Run a :class:`~llamppl.SubModel` inside this step, scoring into this particle; returns its result.

        ``await`` it in an ``async def step``; in a plain ``def step`` it returns the value.
        """
        from .submodel import check_submodel

        check_submodel(sub)
        return self._primitive("call", sub.run_with_parent(self))

    def intervene(self, dist: Distribution, value: Any):
        """Force ``dist`` to take ``value`` (its side effects happen) without scoring it."""
        return self._primitive("intervene", self.intervene_async(dist, value))

    def _primitive(self, name: str, coro):
        """The value in a plain ``def step`` (greenlet); else the coroutine, watched for a missing await."""
        return _await_from_greenlet(coro) if self._sync else expect_await(name, coro)

    def immutable_properties(self) -> set[str]:
        """Names of attributes shared, not deep-copied, between clones (override; default none)."""
        return set()

    def reset(self) -> None:
        """Back to weight 0, unfinished, no pending twist (the state attributes are untouched)."""
        self.weight = 0.0
        self.finished = False
        self._twist_amount = 0.0
        self._failure = None
        self._ending = None

    def finish(self) -> None:
        """Mark the particle as done; inference stops stepping it."""
        self.finished = True

    def done_stepping(self) -> bool:
        """True once the particle finished or its weight is -inf."""
        return self.finished or self.weight == -math.inf

    # ------------------------------------------------------------------ engine interface
    async def run_step(self) -> None:
        """Run one call of ``step`` (plain or async); a dead particle's step ends early.

        ``TypeError`` at the end of the step if it left a primitive unawaited.
        """
        await self._call_hook(self.step, "step")

    async def run_start(self) -> None:
        """Run the optional ``start`` hook (plain or async), like :meth:`run_step`."""
        await self._call_hook(self.start, "start")

    @contextlib.contextmanager
    def replaying(self, chooser: Any) -> Iterator[None]:
        """While active, every ``sample`` returns ``await chooser.choose(self, dist, proposal)``.

        The chooser decides the value and scores it (``enumerate_exact`` replays and
        branches a step this way, ``csmc_standard`` records or forces a particle's
        choices); ``observe`` / ``condition`` / ``twist`` score as usual.
        """
        previous, self._chooser = self._chooser, chooser
        try:
            yield
        finally:
            self._chooser = previous

    def clone(self) -> Model:
        """Deep copy of the particle's state; LMs (and their caches) are shared, not copied."""
        shared = self.immutable_properties()
        if not isinstance(shared, (set, frozenset, list, tuple)):
            raise TypeError(
                f"immutable_properties() must return a set of attribute names, got {type(shared).__name__}"
            )
        memo = {
            id(getattr(self, name)): getattr(self, name) for name in shared if hasattr(self, name)
        }
        return copy.deepcopy(self, memo)

    def state_key(self) -> Any:
        """Hashable summary of the full state (not the weight): equal keys mean interchangeable particles."""
        skip = ("weight", "_sync", "_chooser")
        return (
            type(self).__name__,
            state_key({k: v for k, v in vars(self).items() if k not in skip}),
        )

    def __str__(self) -> str:
        return self.string_for_serialization()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} weight={self.weight:.4g}{' finished' if self.finished else ''}: {self}>"

    # ------------------------------------------------------------------ internals
    def _check_alive(self) -> None:
        if self.weight == -math.inf:
            raise ParticleDead()

    async def sample_async(self, dist: Distribution, proposal: Distribution | None = None) -> Any:
        """:meth:`sample` as a coroutine, also inside a plain ``def step`` (used by submodels)."""
        if not isinstance(dist, Distribution):
            raise TypeError(f"sample(dist) needs a Distribution, got {type(dist).__name__}")
        if proposal is not None and not isinstance(proposal, Distribution):
            raise TypeError(
                f"sample(proposal=...) needs a Distribution, got {type(proposal).__name__}"
            )
        self._check_alive()
        if self._chooser is not None:
            return await self._chooser.choose(self, dist, proposal)
        if proposal is None:
            value, _ = await dist.sample()
            return value
        value, log_q = await proposal.sample()
        log_p = await dist.log_prob(value)
        self._add_score(
            real_number(f"{type(dist).__name__}.log_prob(value)", log_p)
            - real_number(f"{type(proposal).__name__}.sample() log-probability", log_q),
            "sample(dist, proposal) weight",
        )
        return value

    async def observe_async(self, dist: Distribution, value: Any) -> Any:
        """:meth:`observe` as a coroutine, also inside a plain ``def step`` (used by submodels)."""
        if not isinstance(dist, Distribution):
            raise TypeError(f"observe(dist, value) needs a Distribution, got {type(dist).__name__}")
        self._check_alive()
        self._add_score(await dist.log_prob(value), f"{type(dist).__name__}.log_prob(value)")
        return value

    async def intervene_async(self, dist: Distribution, value: Any) -> Any:
        """:meth:`intervene` as a coroutine, also inside a plain ``def step`` (used by submodels)."""
        if not isinstance(dist, Distribution):
            raise TypeError(
                f"intervene(dist, value) needs a Distribution, got {type(dist).__name__}"
            )
        self._check_alive()
        await dist.log_prob(value)  # side effects only, no score
        return value

    async def _call_hook(self, fn, hook: str) -> None:
        with awaits_checked(f"{type(self).__name__}.{hook}"):
            try:
                if inspect.iscoroutinefunction(fn):
                    await fn()
                else:
                    await self._run_plain(fn)
            except ParticleDead:
                pass

    async def _run_plain(self, fn) -> None:
        """Drive a plain function in a greenlet, awaiting what its primitives hand back."""
        import greenlet

        child = greenlet.greenlet(fn)
        self._sync = True
        try:
            request = child.switch()
            while not child.dead:
                try:
                    result = await request
                except BaseException as exc:  # deliver errors where the user's code awaited
                    request = child.throw(exc)
                else:
                    request = child.switch(result)
        finally:
            self._sync = False


def state_key(obj: Any) -> Any:
    """A hashable key for ``obj``'s value, recursing into containers and ``state_key()`` methods."""
    if hasattr(obj, "state_key") and callable(obj.state_key) and not isinstance(obj, type):
        return obj.state_key()
    if isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return obj
    if isinstance(obj, dict):
        return tuple(sorted((repr(k), state_key(v)) for k, v in obj.items()))
    if isinstance(obj, (list, tuple)):
        return tuple(state_key(v) for v in obj)
    if isinstance(obj, (set, frozenset)):
        return tuple(sorted(repr(v) for v in obj))
    if isinstance(obj, np.ndarray):
        return (obj.dtype.str, obj.shape, obj.tobytes())
    if type(obj).__module__.startswith("torch") and hasattr(obj, "tolist"):
        return ("tensor", state_key(obj.tolist()))
    if hasattr(obj, "__index__"):
        return int(obj)
    try:
        hash(obj)
        return obj
    except TypeError:
        return repr(obj)
