"""SMILES strings as a hard constraint: a partial-SMILES prefix check, closed under prefixes.

:func:`smiles` returns a :class:`Smiles` constraint on the generated text (the ``chem``
extra: ``pip install 'llamppl[chem]'``, which installs ``partialsmiles``):

- **complete check** (``accepts_end``): ``partialsmiles.ParseSmiles(s, partial=False)``
  accepts the text: a whole, valid SMILES string (rings and branches closed, common
  valences, aromatic systems that kekulize);
- **prefix check** (``__call__``): every character prefix of the text is a *partial*
  SMILES, each judged with its last symbol finished (below).

``ParseSmiles(s, partial=True)`` alone is *not* closed under prefixes, because a SMILES
symbol can be one or two characters and the parser judges a text that stops inside one by
its shorter reading: ``"[A"`` is refused (no element ``A``) while ``"[Al"`` is accepted;
``"C1CC#B"`` is refused (boron with four bonds: the triple bond and the one that must
continue the open ring) while ``"C1CC#Br"`` is accepted (bromine allows more); a two-digit
ring label ``"%12"`` being written reads as ``"%1"``. A check that
refuses ``"[A"`` but accepts ``"[Al"`` must not prune the vocabulary's trie at ``"[A"``.
So a prefix ``p`` is *accepted* when the parser accepts ``p``, or accepts ``p + y`` for an
ending ``y`` of the symbol ``p`` stops inside:

- an element's first letter in a bracket atom (``[``, optional isotope digits, one letter):
  ``y`` is a second letter of an element symbol (``[A`` → ``[Al``, ``[t`` → ``[te``);
- ``C`` or ``B`` outside brackets: ``l`` or ``r`` (``Cl``, ``Br``; halogens allow more
  bonds than carbon and boron);
- ``%`` or ``%d``: the rest of a ``%`` label written earlier in the text (a new label acts
  as the shorter one does: it opens a ring bond).

and the prefix check accepts a text iff every character prefix of it (itself included) is
accepted. That makes it closed under prefixes **by construction** (a rejected text has a
rejected prefix, which every extension shares), so :attr:`Smiles.prefix_closed` is True and
dead ends are proved on the vocabulary's trie with a few hundred checks instead of one per
token. Verdicts of character prefixes are remembered (an LRU of ``cache_size`` texts), so
checking ``s`` + a token costs one parse per character of the token.

``leading_space=True`` ignores one space at the start of the text (a prompt ending in
``"Molecule:"`` makes the LM write ``" CCO"``).

The count of ring bonds and branches a prefix leaves open, :func:`open_closures`, is a
guide, not a bound on tokens (one token such as ``"12"`` or ``")1"`` closes two), so
:class:`Smiles` does not give it as ``need``; a program may twist with it::

    from llamppl.decoding.chemistry import smiles
    c = smiles(leading_space=True)
    c(" CC(=O"), c(" CC(=O)X"), c.accepts_end(" CC(=O)O")    # (True, False, True)
"""

from __future__ import annotations

from functools import lru_cache
from types import ModuleType

from llamppl.decoding.constraints.protocol import Constraint
from llamppl.lm.memo import LRU
from llamppl.validation import check_positive_int

__all__ = [
    "CHEM_EXTRA",
    "Smiles",
    "open_closures",
    "require_partialsmiles",
    "smiles",
    "symbol_endings",
]

#: What to install for :func:`smiles`.
CHEM_EXTRA = "pip install 'llamppl[chem]'"


def require_partialsmiles() -> ModuleType:
    """The ``partialsmiles`` module, or an ``ImportError`` that says what to install."""
    try:
        import partialsmiles
    except ImportError as exc:
        raise ImportError(
            f"smiles() needs the partialsmiles package (the chem extra): {CHEM_EXTRA}"
        ) from exc
    return partialsmiles


@lru_cache(maxsize=1)
def _second_letters() -> dict[str, str]:
    """``{first letter: second letters}`` of partialsmiles' two-letter element symbols."""
    from partialsmiles.elements import elements

    out: dict[str, str] = {}
    for symbol in sorted(elements):
        if len(symbol) == 2:
            out[symbol[0]] = out.get(symbol[0], "") + symbol[1]
    return out


def symbol_endings(smiles_text: str) -> list[str]:
    """The endings of the unfinished multi-character symbol ``smiles_text`` stops inside, if any.

    A bracket atom's one-letter element start (``"[A"``: the second letters of ``Ag``,
    ``Al``, ...), ``C`` / ``B`` outside brackets (``"l"`` / ``"r"``), and ``%`` / ``%d``
    (the rest of each ``%`` label written earlier). ``[]`` when the text ends on a whole
    symbol.
    """
    if not smiles_text:
        return []
    open_bracket = smiles_text.rfind("[")
    if open_bracket > smiles_text.rfind("]"):  # inside a bracket atom
        inner = smiles_text[open_bracket + 1 :].lstrip("0123456789")
        if len(inner) == 1 and inner.isalpha():
            return list(_second_letters().get(inner.upper(), ""))
        return []
    last = smiles_text[-1]
    if last in "CB":
        return ["l" if last == "C" else "r"]
    percent = smiles_text.rfind("%")
    tail = smiles_text[percent:] if percent >= 0 else ""
    if not tail or len(tail) >= 3:
        return []
    labels = {smiles_text[i : i + 3] for i in range(percent) if smiles_text[i] == "%"}
    return sorted({lab[len(tail) :] for lab in labels if len(lab) == 3 and lab.startswith(tail)})


class Smiles(Constraint):
    """The text is (the start of) a SMILES string; it may end only on a whole, valid one.

    See the module docstring for both checks. The prefix check is closed under prefixes
    by construction, so ``prefix_closed`` is True.

    Parameters
    ----------
    leading_space : bool
        Ignore one space at the start of the text (default False).
    cache_size : int
        Verdicts of character prefixes remembered (default 65,536).

    Attributes
    ----------
    parses : int
        ``partialsmiles`` parses made so far (the checks' cost).
    """

    prefix_closed = True  # every character prefix is checked: see the module docstring

    def __init__(self, leading_space: bool = False, cache_size: int = 65_536) -> None:
        if not isinstance(leading_space, bool):
            raise TypeError(f"leading_space must be a bool, got {type(leading_space).__name__}")
        self.leading_space = leading_space
        self.cache_size = check_positive_int("cache_size", cache_size)
        self.parse_smiles = require_partialsmiles().ParseSmiles  # a function: pickles by name
        self.parses = 0
        self._accepted: LRU[str, bool] = LRU(self.cache_size)  # SMILES prefix -> verdict

    def smiles_text(self, text: str) -> str:
        """The SMILES part of a generated text (one leading space dropped if allowed)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return text[1:] if self.leading_space and text.startswith(" ") else text

    def parse(self, smiles_text: str, partial: bool) -> bool:
        """Whether ``ParseSmiles(smiles_text, partial=partial)`` accepts the text."""
        self.parses += 1
        try:
            self.parse_smiles(smiles_text, partial=partial)
        except Exception:  # noqa: BLE001 - its errors, and its own slips on odd input
            return False
        return True

    def accepted(self, smiles_text: str) -> bool:
        """One character prefix's verdict: it parses as a partial SMILES, now or once the
        symbol it stops inside is finished (:func:`symbol_endings`)."""
        if self.parse(smiles_text, True):
            return True
        return any(self.parse(smiles_text + y, True) for y in symbol_endings(smiles_text))

    def __call__(self, text: str) -> bool:
        """The prefix check: every character prefix of the SMILES text is accepted."""
        s = self.smiles_text(text)
        found = self._accepted.get(s)
        if found is not None:
            return found
        known = len(s) - 1  # the longest prefix with a remembered verdict
        while known >= 0 and self._accepted.get(s[:known]) is None:
            known -= 1
        if known >= 0 and not self._accepted.get(s[:known]):
            self._accepted.put(s, False)
            return False
        for end in range(max(known, -1) + 1, len(s) + 1):
            verdict = self.accepted(s[:end])
            self._accepted.put(s[:end], verdict)
            if not verdict:
                self._accepted.put(s, False)
                return False
        return True

    def accepts_end(self, text: str) -> bool:
        """The complete check: ``ParseSmiles(s, partial=False)`` accepts the SMILES text."""
        return self.parse(self.smiles_text(text), False)

    def __repr__(self) -> str:
        return f"smiles(leading_space={self.leading_space})"


def smiles(leading_space: bool = False) -> Smiles:
    """Constraint: the generated text is a SMILES string (module docstring); needs ``partialsmiles``.

    ``leading_space=True`` ignores one space at the start (a prompt ending in ``":"``).
    """
    return Smiles(leading_space)


def open_closures(text: str) -> int:
    """Ring bonds and branches a SMILES prefix leaves open (surrounding whitespace ignored).

    Each needs a later ring label or ``")"`` before the molecule can end, so the count says
    how far the text is from an ending, as partialsmiles reads ring labels (a digit, or
    ``%`` and the next two characters) and skips bracket atoms. A guide for a twist, not a
    bound on tokens: one token such as ``"12"`` or ``")1"`` closes two.

    >>> open_closures(" BrC1=C2C3CC(C"), open_closures("C1CC1C(=O)O")
    (4, 0)
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    rings: set[str] = set()
    depth, i, t = 0, 0, text.strip()
    while i < len(t):
        ch = t[i]
        if ch == "[":  # a bracket atom: its digits are charges or counts, not ring labels
            end = t.find("]", i)
            i = len(t) if end < 0 else end + 1
            continue
        if ch == "%":
            rings ^= {t[i : i + 3]}
            i += 3
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch.isdigit():
            rings ^= {ch}
        i += 1
    return len(rings) + depth
