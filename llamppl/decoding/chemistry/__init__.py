"""Chemistry constraints (``llamppl.decoding.chemistry``; the ``chem`` extra).

- :mod:`~llamppl.decoding.chemistry.smiles` — :func:`smiles`: the text is a SMILES string
  (a partial-SMILES prefix check closed under prefixes, a complete check), and
  :func:`open_closures`, the ring bonds and branches a prefix leaves open (a guide).

Users import them from :mod:`llamppl.constraints`::

    from llamppl.decoding.chemistry import smiles
"""

from llamppl.decoding.chemistry.smiles import (
    CHEM_EXTRA,
    Smiles,
    open_closures,
    require_partialsmiles,
    smiles,
)

__all__ = ["CHEM_EXTRA", "Smiles", "open_closures", "require_partialsmiles", "smiles"]
