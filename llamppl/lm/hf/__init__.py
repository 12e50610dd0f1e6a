"""The Hugging Face backend: :class:`CachedCausalLM`, the token-trie LM over a ``transformers`` model.

Everything that only this backend needs lives here: loading (:mod:`.load`, the embedded
SmolLM2 in :mod:`.embedded`), what an architecture must offer (:mod:`.arch`), the transformers
names we pass (:mod:`.api`), the K/V slot pool (:mod:`.kv_pool`) and the trie over it
(:mod:`.trie_cache`), the row layout of a batched forward (:mod:`.batch_plan`), its tree
masks (:mod:`.tree_mask`), attention over a shared prefix (:mod:`.prefix_attention`) and the
construction-time exactness probe (:mod:`.exactness`)::

    from llamppl.lm.hf import CachedCausalLM
    lm = CachedCausalLM.default()
"""

from .cached_causal_lm import CachedCausalLM, CacheStats

__all__ = ["CachedCausalLM", "CacheStats"]
