"""Language models: the :class:`LanguageModel` interface, the exact :class:`FunctionLM`,
and the Hugging Face backed :class:`CachedCausalLM` with its token-trie KV cache.

``CachedCausalLM`` and ``CacheStats`` are imported on first use (PEP 562 ``__getattr__``):
their backend loads ``transformers``, which costs seconds that programs on a
:class:`FunctionLM` or a :class:`VLLMLM` never need."""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from .base import LanguageModel, LMStats, validate_token_ids
from .bytes import ByteLM, ByteLMStats
from .function_lm import FunctionLM
from .vllm import VLLMLM, VLLMStats

if _TYPE_CHECKING:  # for type checkers and the docs; at run time see __getattr__
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

#: Names of the Hugging Face backend, imported when first looked up.
_HF_NAMES = ("CachedCausalLM", "CacheStats")


def __getattr__(name: str) -> _Any:
    if name in _HF_NAMES:
        from .hf import cached_causal_lm

        value = getattr(cached_causal_lm, name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_HF_NAMES})
