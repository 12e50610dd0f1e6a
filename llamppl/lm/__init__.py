"""Language models: the :class:`LanguageModel` interface, the exact :class:`FunctionLM`,
and the Hugging Face backed :class:`CachedCausalLM` with its token-trie KV cache.

``CachedCausalLM`` and ``CacheStats`` are imported on first use (:mod:`llamppl.lazy_exports`):
their backend loads ``transformers``, which costs seconds that programs on a
:class:`FunctionLM` or a :class:`VLLMLM` never need."""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from llamppl import lazy_exports

from .base import LanguageModel, LMStats, validate_token_ids
from .bytes import ByteLM, ByteLMStats
from .function_lm import FunctionLM
from .vllm import VLLMLM, VLLMStats

if _TYPE_CHECKING:  # for type checkers and the docs; at run time: __getattr__ below
    from .hf.cached_causal_lm import CachedCausalLM, CacheStats

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

__getattr__, __dir__ = lazy_exports.lazy_exports(
    globals(),
    {
        "CachedCausalLM": "llamppl.lm.hf.cached_causal_lm:CachedCausalLM",
        "CacheStats": "llamppl.lm.hf.cached_causal_lm:CacheStats",
    },
)
