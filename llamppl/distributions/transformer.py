"""LLaMPPL module path ``llamppl.distributions.transformer``: the same ``Transformer`` as ``llamppl.Transformer``."""

from . import Transformer

__all__ = ["Transformer"]
