"""The twist that guides :class:`~llamppl.models.HardConstraint`'s particles (LLaMPPL §2.2).

A twist ψ(s) multiplies a live particle's weight by a guess of how well its text can still
end; SMC resamples on the twisted weights, and the twist is divided out again when the
particle ends (ψ = 1 on a final text), so the posterior and Z do not depend on it
(``Model.twist`` / ``untwist``). Here

    log ψ(s) = end · 1_{C_F}(s) − need · need(s) − target · missing(s)

with C_F the complete check (``Constraint.ends``), ``need(s)`` the fewest tokens a
passing completion still needs (``Constraint.need``) and ``missing(s)`` the given targets
the prefix has not yet certainly met (``Constraint.missing``: a required word not yet at
its position, each word of a paragraph's required last sentence not yet copied). Certainly
met, not "met if the text ended here": text whose units the judge could still split several
ways (runs of dots, words glued by periods) must not earn the credit. The one provisional
credit is a copy of a required sentence under way where it may stand last: it is withdrawn
the moment the copy breaks. The target term pays a particle back the LM's price of writing
a required word, so the particles that put it off do not outweigh it.

A program may add a twist of its own, ``HardConstraint(..., twist=fn)``: any callable of the
particle that returns log ψ (a real number, or an awaitable of one: a learned twist,
:class:`~llamppl.inference.twist_learning.LearnedTwist`, reads the LM's hidden state), added
to the terms above and undone at the end like them (:func:`twist_level`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llamppl.decoding.constraints.protocol import Constraint
from llamppl.lm.base import LanguageModel
from llamppl.validation import check_real_range, real_number

__all__ = ["Twists", "check_twist", "twist_level"]


@dataclass(frozen=True)
class Twists:
    """The three log-factors of ψ (module docstring); each a finite number >= 0, 0 = off."""

    end: float
    need: float
    target: float

    @classmethod
    def checked(cls, end: object, need: object, target: object, end_varies: bool = True) -> Twists:
        """The factors, validated (a ``ValueError``/``TypeError`` names ``end_twist``, ...);
        the end twist is dropped when the complete check cannot vary along a run
        (``end_varies=False``: a bare callable, whose complete check is its prefix check)."""
        end, need, target = (
            check_real_range(f"{name}_twist", real_number(f"{name}_twist", value), 0.0, math.inf)
            for name, value in (("end", end), ("need", need), ("target", target))
        )
        return cls(end if end_varies else 0.0, need, target)

    def log_psi(self, constraint: Constraint, lm: LanguageModel, state: Any) -> tuple[float, int]:
        """``(log ψ(state), complete checks made)``."""
        level, checks = 0.0, 0
        if self.end:
            checks += 1
            level += self.end if constraint.ends(lm, state) else 0.0
        if self.need:
            level -= self.need * constraint.need(lm, state)
        if self.target:
            level -= self.target * constraint.missing(lm, state)
        return level, checks


def check_twist(twist: object) -> Callable | None:
    """``twist`` if it is None or callable, else a ``TypeError`` naming it."""
    if twist is not None and not callable(twist):
        raise TypeError(
            "twist must be a callable of the particle returning log ψ (a number or an "
            f"awaitable of one), or None; got {type(twist).__name__}"
        )
    return twist


async def twist_level(twist: Callable, model: Any) -> float:
    """log ψ of a program's own twist for ``model``: ``twist(model)``, awaited if it is
    awaitable; a finite real number (``ValueError`` for NaN or an infinity, since ψ must be
    positive and finite for the twists to cancel)."""
    value = twist(model)
    if inspect.isawaitable(value):
        value = await value
    value = real_number("twist(model)", value)
    if not math.isfinite(value):
        raise ValueError(f"twist(model) must be a finite log ψ, got {value}")
    return value
