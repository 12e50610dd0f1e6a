"""LLaMPPL module path ``llamppl.distributions.distribution``: the same ``Distribution`` as ``llamppl.Distribution``."""

from . import Distribution

__all__ = ["Distribution"]
