"""Language models: the :class:`LanguageModel` interface, the exact :class:`FunctionLM`,
and the Hugging Face backed :class:`CachedCausalLM` with its token-trie KV cache."""

from .base import LanguageModel, LMStats, validate_token_ids
from .bytes import ByteLM, ByteLMStats
from .function_lm import FunctionLM
from .hf.cached_causal_lm import CachedCausalLM, CacheStats
from .vllm import VLLMLM, VLLMStats

__all__ = [
    "LanguageModel",
    "LMStats",
    "FunctionLM",
    "CachedCausalLM",
    "CacheStats",
    "validate_token_ids",
    "VLLMLM",
    "VLLMStats",
    "ByteLM",
    "ByteLMStats",
]
