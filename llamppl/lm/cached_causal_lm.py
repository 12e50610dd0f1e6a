"""Placeholder while the foundation work lands (replaced by the trie-backed implementation)."""

from .base import LanguageModel


class CachedCausalLM(LanguageModel):
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("CachedCausalLM is being written")
