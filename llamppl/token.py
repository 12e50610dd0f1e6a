"""``Token``: a sampled vocabulary item.

A ``Token`` compares equal to its integer id and to any other ``Token`` with the
same id; ``str(token)`` is its text::

    tok = Token(lm, 42)
    tok == 42, int(tok), str(tok)

Drawing tokens from log-probabilities is :mod:`llamppl.row_sampling`'s job.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Token"]


class Token:
    """A token id together with the language model that gives it meaning."""

    __slots__ = ("lm", "token_id")

    def __init__(self, lm, token_id: int) -> None:
        self.lm = lm
        self.token_id = int(token_id)

    def __str__(self) -> str:
        return self.lm.vocab[self.token_id]

    def __repr__(self) -> str:
        return f"<Token {self.token_id} {str(self)!r}>"

    def __int__(self) -> int:
        return self.token_id

    __index__ = __int__

    def __eq__(self, other: object) -> bool:
        """Equal to its id and to any ``Token`` with the same id."""
        if isinstance(other, Token):
            return self.token_id == other.token_id
        if isinstance(other, (int, np.integer)) and not isinstance(other, bool):
            return self.token_id == int(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.token_id)

    def __deepcopy__(self, memo) -> Token:
        return self  # immutable; shares the LM
