"""LLaMPPL module path ``llamppl.distributions.logcategorical``: the same ``LogCategorical`` as ``llamppl.LogCategorical``."""

from . import LogCategorical

__all__ = ["LogCategorical"]
