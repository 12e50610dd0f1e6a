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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llamppl.decoding.constraints.protocol import Constraint
from llamppl.lm.base import LanguageModel
from llamppl.validation import check_real_range, real_number

__all__ = ["Twists"]


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
