"""LLaMPPL module path ``llamppl.distributions.tokencategorical``: the same ``TokenCategorical`` as ``llamppl.TokenCategorical``."""

from . import TokenCategorical

__all__ = ["TokenCategorical"]
