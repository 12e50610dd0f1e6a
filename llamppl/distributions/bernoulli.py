"""LLaMPPL module path ``llamppl.distributions.bernoulli``: the same ``Bernoulli`` as ``llamppl.Bernoulli``."""

from . import Bernoulli

__all__ = ["Bernoulli"]
