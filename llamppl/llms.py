"""LLaMPPL module path ``llamppl.llms``: the language models and ``Token``, under their old module.

    from llamppl.llms import CachedCausalLM     # is llamppl.CachedCausalLM

``MLX_AVAILABLE`` is always False here (there is no MLX backend); programs that
branch on it take their non-MLX path. ``CachedTransformer`` is this project's
design name of the token-trie LM, the same class as ``CachedCausalLM``.
"""

from .lm import VLLMLM, CachedCausalLM, FunctionLM, LanguageModel
from .token import Token

CachedTransformer = CachedCausalLM
MLX_AVAILABLE = False

__all__ = [
    "CachedCausalLM",
    "CachedTransformer",
    "FunctionLM",
    "LanguageModel",
    "MLX_AVAILABLE",
    "Token",
    "VLLMLM",
]
