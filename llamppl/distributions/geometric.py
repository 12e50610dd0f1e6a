"""LLaMPPL module path ``llamppl.distributions.geometric``: the same ``Geometric`` as ``llamppl.Geometric``."""

from . import Geometric

__all__ = ["Geometric"]
