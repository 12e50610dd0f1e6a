"""The constraint protocol (``llamppl.decoding.constraints``): what every hard constraint
answers, how constraints compose, and what every check shares.

- :mod:`~llamppl.decoding.constraints.protocol` — :class:`Constraint` (prefix check,
  complete check, optional batched mask, optional state), :class:`PredicateConstraint` (a
  plain callable), :class:`AllOf` (``a & b``) and :func:`as_constraint`;
- :mod:`~llamppl.decoding.constraints.time_bound` — the time bound on every check
  (:class:`CheckTimeout`, :func:`time_bound`);
- :mod:`~llamppl.decoding.constraints.mask_rows` — the end rules applied to batched masks;
- :mod:`~llamppl.decoding.constraints.twists` — the guides a program derives from a
  constraint's signals (``ends``, ``need``, ``missing``) as a twist.

Users import constraints from :mod:`llamppl.constraints`::

    from llamppl.decoding.constraints import Constraint, PredicateConstraint
"""

from llamppl.decoding.constraints.protocol import (
    AllOf,
    Constraint,
    ConstraintFailure,
    PredicateConstraint,
    as_constraint,
    may_list,
    sound_listings,
)
from llamppl.decoding.constraints.time_bound import (
    DEFAULT_CHECK_TIMEOUT,
    CheckTimeout,
    bounded_call,
    time_bound,
)

__all__ = [
    "AllOf",
    "CheckTimeout",
    "Constraint",
    "ConstraintFailure",
    "DEFAULT_CHECK_TIMEOUT",
    "PredicateConstraint",
    "as_constraint",
    "bounded_call",
    "may_list",
    "sound_listings",
    "time_bound",
]
