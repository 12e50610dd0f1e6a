"""LLaMPPL module path ``llamppl.distributions.lmcontext``: the classes of :mod:`llamppl.context`.

from llamppl.distributions.lmcontext import LMContext   # is llamppl.LMContext
"""

from ..context import LMContext, LMNextToken, LMTokenMask

__all__ = ["LMContext", "LMNextToken", "LMTokenMask"]
