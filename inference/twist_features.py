"""What a learned twist sees of a particle: the feature interface and ready-made features.

A twist ψ_θ(s_{1:t}) (Twisted SMC, ``papers.md`` §6) is a function of the particle's prefix.
A learned one reads it through :class:`TwistFeatures`: a tuple of named features, each an
``async`` function of the particle (a :class:`~llamppl.Model`) that returns a 1-D float
tensor, concatenated into one vector ``x`` of fixed width::

    from llamppl.inference.twist_features import (
        TwistFeatures, constraint_signals, hidden_state, progress, repetition)
    features = TwistFeatures(hidden_state(), constraint_signals(), progress(), repetition())
    x = await features(particle)            # (D,) float32

Ready-made features (each reads only what the particle has; a particle without it is a
``TypeError`` naming the feature and what it needs):

- :func:`hidden_state` — the LM's final hidden state after the particle's context
  (``await lm.next_token_hidden(tokens)``, :class:`~llamppl.CachedCausalLM` or a
  :class:`~llamppl.lm.vllm.lm.VLLMLM` with ``capture="processor"``): the row the forward
  computes anyway, so reading it costs no second pass (the next step's log-probs are then
  a cache hit);
- :func:`constraint_signals` — a constrained particle's own signals
  (:class:`~llamppl.models.HardConstraint`): the complete check ``ends``, the constraint's
  ``need`` and ``missing``;
- :func:`progress` — tokens generated over the token budget, and the tokens left;
- :func:`repetition` — whether the last tokens repeat with period 1, 2, 3 (a looping LM);
- :func:`last_token` — one-hot of the last generated token (a small vocabulary, e.g. a
  :class:`~llamppl.FunctionLM`, which has no hidden state);
- :func:`text_feature` — any function of the particle's text to numbers (a user's own).

Every ready-made feature has a ``spec`` (its name and arguments), so a saved twist rebuilds
its features on load (:meth:`~llamppl.inference.twist_learning.LearnedTwist.load`); a
:func:`text_feature` holds the user's function and is passed again on load.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from llamppl.modeling import Model

__all__ = [
    "Feature",
    "TwistFeatures",
    "constraint_signals",
    "hidden_state",
    "last_token",
    "progress",
    "repetition",
    "text_feature",
    "FEATURES",
]


@dataclass(frozen=True)
class Feature:
    """One named feature of a particle: ``await feature(model)`` → ``(k,)`` float32.

    Attributes
    ----------
    name : str
        Its name (in saved twists and error messages).
    fn : Callable[[Model], Awaitable[torch.Tensor]]
        The async function of the particle.
    spec : tuple | None
        ``(builder name, kwargs)`` that rebuilds it (:data:`FEATURES`); None for a user's
        own function, which a load must be given again.
    """

    name: str
    fn: Callable[[Model], Awaitable[torch.Tensor]] = field(compare=False)
    spec: tuple[str, tuple[tuple[str, Any], ...]] | None = None

    async def __call__(self, model: Model) -> torch.Tensor:
        x = torch.as_tensor(await self.fn(model), dtype=torch.float32).reshape(-1)
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"twist feature {self.name!r} gave a non-finite value: {x.tolist()}")
        return x

    def __deepcopy__(self, memo: dict) -> Feature:
        return self  # stateless: particles share it


class TwistFeatures:
    """The features a twist reads, concatenated: ``await features(model)`` → ``(D,)``.

    Parameters
    ----------
    *features : Feature
        The ready-made features of this module or :func:`text_feature`; at least one.
    """

    def __init__(self, *features: Feature) -> None:
        if not features:
            raise ValueError("TwistFeatures needs at least one feature, got none")
        for i, f in enumerate(features):
            if not isinstance(f, Feature):
                raise TypeError(
                    f"features[{i}] must be a Feature (hidden_state(), progress(), "
                    f"text_feature(fn), ...), got {type(f).__name__}"
                )
        self.features: tuple[Feature, ...] = tuple(features)

    @property
    def names(self) -> tuple[str, ...]:
        """The features' names, in order."""
        return tuple(f.name for f in self.features)

    async def __call__(self, model: Model) -> torch.Tensor:
        """The particle's feature vector ``(D,)`` float32 (the features awaited in order)."""
        return torch.cat([await f(model) for f in self.features])

    def specs(self) -> list[tuple[str, tuple[tuple[str, Any], ...]] | None]:
        """Each feature's ``spec`` (None for a user's function)."""
        return [f.spec for f in self.features]

    @classmethod
    def from_specs(cls, specs: Sequence[Any]) -> TwistFeatures:
        """The features a list of specs names (``ValueError`` for a user's function)."""
        out = []
        for i, spec in enumerate(specs):
            if spec is None:
                raise ValueError(
                    f"feature {i} is a user's function (text_feature): pass features= to load"
                )
            builder, kwargs = spec
            if builder not in FEATURES:
                raise ValueError(f"unknown feature {builder!r}; known: {sorted(FEATURES)}")
            out.append(FEATURES[builder](**dict(kwargs)))
        return cls(*out)

    def __deepcopy__(self, memo: dict) -> TwistFeatures:
        return self

    def __repr__(self) -> str:
        return f"TwistFeatures({', '.join(self.names)})"


def _context(model: Model, feature: str) -> Any:
    context = getattr(model, "context", None)
    if context is None or not hasattr(context, "tokens"):
        raise TypeError(
            f"twist feature {feature!r} reads the particle's LMContext as `model.context`; "
            f"{type(model).__name__} has none"
        )
    return context


def _spec(builder: str, **kwargs: Any) -> tuple[str, tuple[tuple[str, Any], ...]]:
    return builder, tuple(sorted(kwargs.items()))


def hidden_state() -> Feature:
    """The LM's final hidden state ``(D,)`` after the particle's context (no second pass:
    :meth:`~llamppl.CachedCausalLM.next_token_hidden`,
    :meth:`~llamppl.lm.vllm.lm.VLLMLM.next_token_hidden`)."""

    async def fn(model: Model) -> torch.Tensor:
        context = _context(model, "hidden_state")
        lm = context.lm
        if not hasattr(lm, "next_token_hidden"):
            raise TypeError(
                f"twist feature 'hidden_state' needs an LM with next_token_hidden "
                f"(CachedCausalLM, VLLMLM); {type(lm).__name__} has none: use last_token() or "
                "constraint_signals() instead"
            )
        return await lm.next_token_hidden(context.tokens)

    return Feature("hidden_state", fn, _spec("hidden_state"))


def constraint_signals() -> Feature:
    """``[ends, need, missing]`` of a constrained particle (``model.constraint`` and
    ``model.state``, as :class:`~llamppl.models.HardConstraint` holds them): whether its text
    passes the complete check, the fewest tokens a passing completion still needs, the given
    targets not yet met (:mod:`llamppl.decoding.constraints.protocol`)."""

    async def fn(model: Model) -> torch.Tensor:
        c, state = getattr(model, "constraint", None), getattr(model, "state", None)
        if c is None or not hasattr(c, "ends"):
            raise TypeError(
                "twist feature 'constraint_signals' reads `model.constraint` and `model.state` "
                f"(a HardConstraint); {type(model).__name__} has none"
            )
        lm = _context(model, "constraint_signals").lm
        return torch.tensor(
            [float(c.ends(lm, state)), float(c.need(lm, state)), float(c.missing(lm, state))]
        )

    return Feature("constraint_signals", fn, _spec("constraint_signals"))


def progress(max_tokens: int | None = None) -> Feature:
    """``[t / T, (T - t) / T, 1 / (T - t + 1)]`` with t the tokens generated and T the budget
    (``max_tokens``, default the particle's ``max_tokens`` attribute)."""
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"max_tokens must be a positive integer or None, got {max_tokens!r}")

    async def fn(model: Model) -> torch.Tensor:
        budget = max_tokens if max_tokens is not None else getattr(model, "max_tokens", None)
        if not budget:
            raise TypeError(
                f"twist feature 'progress' needs a token budget: {type(model).__name__} has no "
                "max_tokens; pass progress(max_tokens=...)"
            )
        t = len(_context(model, "progress").generated)
        left = max(budget - t, 0)
        return torch.tensor([t / budget, left / budget, 1.0 / (left + 1)])

    return Feature("progress", fn, _spec("progress", max_tokens=max_tokens))


def repetition(periods: Sequence[int] = (1, 2, 3), horizon: int = 12) -> Feature:
    """For each period p: the length of the run of generated tokens that repeats with period p
    at the end of the context, over ``horizon`` (capped at 1): a looping LM (``CCCC…``)
    shows it."""
    periods = tuple(int(p) for p in periods)
    if not periods or min(periods) < 1:
        raise ValueError(f"periods must be positive integers, got {periods!r}")

    async def fn(model: Model) -> torch.Tensor:
        gen = list(_context(model, "repetition").generated)
        out = []
        for p in periods:
            run = 0
            while run + p < len(gen) and gen[-1 - run] == gen[-1 - run - p]:
                run += 1
            out.append(min(run / horizon, 1.0))
        return torch.tensor(out)

    return Feature("repetition", fn, _spec("repetition", periods=periods, horizon=horizon))


def last_token(vocab_size: int) -> Feature:
    """One-hot ``(vocab_size + 1,)`` of the last generated token (the extra slot: none yet)."""
    if not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")

    async def fn(model: Model) -> torch.Tensor:
        gen = _context(model, "last_token").generated
        x = torch.zeros(vocab_size + 1)
        x[int(gen[-1]) if len(gen) else vocab_size] = 1.0
        return x

    return Feature("last_token", fn, _spec("last_token", vocab_size=vocab_size))


def text_feature(fn: Callable[[str], float | Sequence[float]], name: str | None = None) -> Feature:
    """A user's function of the particle's text (``model.text`` if it has one, else
    ``str(model)``) to one number or a fixed-length list of numbers, e.g. the open rings of a
    SMILES prefix."""
    if not callable(fn):
        raise TypeError(f"text_feature needs a callable on the text, got {type(fn).__name__}")
    label = name or getattr(fn, "__name__", "text_feature")

    async def feature(model: Model) -> torch.Tensor:
        text = getattr(model, "text", None)
        value = fn(text if isinstance(text, str) else str(model))
        return torch.as_tensor(value, dtype=torch.float32).reshape(-1)

    return Feature(label, feature, None)


#: The ready-made features by name (what a saved twist's specs rebuild).
FEATURES: dict[str, Callable[..., Feature]] = {
    "hidden_state": hidden_state,
    "constraint_signals": constraint_signals,
    "progress": progress,
    "repetition": repetition,
    "last_token": last_token,
}
