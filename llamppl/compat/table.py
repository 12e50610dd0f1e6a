"""THE compatibility table: every LLaMPPL / hfppl spelling (and every alias of ours), old -> ours.

One row per spelling. A key names the old spelling, a value names what it is here; both are
paths, ``"package.module"`` or ``"package.module:name"`` / ``"package.module:Class.attribute"``
(the part after ``:`` is looked up with ``getattr``). What a row does follows from its key:

- ``"old.module"`` (no ``:``) — an old module path: importing it gives our module itself, and
  every path below it maps the same way (``hfppl.llms`` is ``llamppl.llms``).
- ``"module:name"`` — a name in a module. If the module is ours, the name is added to it, looked
  up on first use (``llamppl.smc_standard`` does not import the engines before it is used) and
  listed in its ``__all__``; if we have no such module (``llamppl.llms``), the module is made
  from its rows.
- ``"module:Class.attribute"`` — an attribute of one of our classes. A value on the same class
  is a rename: the two names are one attribute at every class level (a subclass that overrides
  either overrides both). Any other value is a thin adapter (``llamppl.compat.adapters``,
  ``llamppl.inference.compat_engines``) set on the class.

A value made with :func:`llamppl.compat.second_form` gives one of OUR names its LLaMPPL form
as well (``LMContext.next_token_logprobs`` also reads as an array): it is called with our
object and its result takes the name. Rows are installed by :mod:`llamppl.compat` (one import
hook); ``docs/compat.md`` lists every row, which ``tests/compat/test_table.py`` checks.

A module that moves adds one row from its old path (``"llamppl.lm.vllm_lm":
"llamppl.lm.vllm.lm"``) and renames the rows whose keys or values name it.

    from llamppl.compat.table import ALIASES
    ALIASES["llamppl.llms:CachedTransformer"]      # 'llamppl.lm:CachedCausalLM'
"""

from __future__ import annotations

__all__ = ["ALIASES"]

_ADAPTERS = "llamppl.compat.adapters"
_ENGINES = "llamppl.inference.compat_engines"

ALIASES: dict[str, str] = {
    # ------------------------------------------------------------ old module paths -> ours
    "hfppl": "llamppl",  # hfppl, LLaMPPL's earlier name: the whole package
    "llamppl.distributed": "llamppl.inference.distributed",  # short name of the Ray fan-out
    "llamppl.models.constraints": "llamppl.decoding.constraints.protocol",
    "llamppl.models.grammar_engine": "llamppl.decoding.grammar.engine",
    "llamppl.models.grammar_logits": "llamppl.decoding.grammar.logits",
    "llamppl.models.power_law": "llamppl.decoding.power_law.sampler",
    "llamppl.models.power_law_proposal": "llamppl.decoding.power_law.proposal",
    # the decoding layer's flat modules, now in rooms by concern
    "llamppl.decoding.mask_rows": "llamppl.decoding.constraints.mask_rows",
    "llamppl.decoding.time_bound": "llamppl.decoding.constraints.time_bound",
    "llamppl.models.constraint_twists": "llamppl.decoding.constraints.twists",
    "llamppl.decoding.text_constraints": "llamppl.decoding.text.characters",
    "llamppl.decoding.text_units": "llamppl.decoding.text.units",
    "llamppl.decoding.text_finality": "llamppl.decoding.text.finality",
    "llamppl.decoding.text_prefix": "llamppl.decoding.text.prefix",
    "llamppl.decoding.text_paragraphs": "llamppl.decoding.text.paragraphs",
    "llamppl.decoding.text_spelling": "llamppl.decoding.text.spelling",
    "llamppl.decoding.text_budget": "llamppl.decoding.text.budget",
    "llamppl.decoding.text_structure_base": "llamppl.decoding.text.base",
    "llamppl.decoding.text_counts": "llamppl.decoding.text.counts",
    "llamppl.decoding.text_positions": "llamppl.decoding.text.positions",
    "llamppl.decoding.text_presence": "llamppl.decoding.text.presence",
    "llamppl.decoding.text_structure": "llamppl.decoding.text.builders",
    "llamppl.decoding.grammar_compile": "llamppl.decoding.grammar.compile",
    "llamppl.decoding.grammar_engine": "llamppl.decoding.grammar.engine",
    "llamppl.decoding.grammar_logits": "llamppl.decoding.grammar.logits",
    "llamppl.decoding.grammar_masks": "llamppl.decoding.grammar.masks",
    "llamppl.decoding.grammar_matcher": "llamppl.decoding.grammar.matcher",
    "llamppl.decoding.native_stack": "llamppl.decoding.grammar.native_stack",
    "llamppl.decoding.json_check": "llamppl.decoding.grammar.json_check",
    "llamppl.decoding.json_patterns": "llamppl.decoding.grammar.json_patterns",
    "llamppl.decoding.json_relax": "llamppl.decoding.grammar.json_relax",
    "llamppl.decoding.schema_budget": "llamppl.decoding.grammar.json_budget",
    "llamppl.decoding.lazy_proposal": "llamppl.decoding.proposals.lazy",
    "llamppl.decoding.token_trie": "llamppl.decoding.proposals.vocab_trie",
    "llamppl.decoding.token_draw": "llamppl.decoding.proposals.token_draw",
    "llamppl.models.token_check": "llamppl.decoding.proposals.token_check",
    "llamppl.models.constrained_tokens": "llamppl.decoding.proposals.constrained_tokens",
    "llamppl.decoding.power_law_proposal": "llamppl.decoding.power_law.proposal",
    "llamppl.lm.vllm_lm": "llamppl.lm.vllm.lm",
    "llamppl.lm.vllm_load": "llamppl.lm.vllm.load",
    "llamppl.lm.batch_plan": "llamppl.lm.hf.batch_plan",
    "llamppl.lm.cached_causal_lm": "llamppl.lm.hf.cached_causal_lm",
    "llamppl.lm.embedded": "llamppl.lm.hf.embedded",
    "llamppl.lm.exactness": "llamppl.lm.hf.exactness",
    "llamppl.lm.hf_api": "llamppl.lm.hf.api",
    "llamppl.lm.hf_arch": "llamppl.lm.hf.arch",
    "llamppl.lm.hf_load": "llamppl.lm.hf.load",
    "llamppl.lm.kv_pool": "llamppl.lm.hf.kv_pool",
    "llamppl.lm.prefix_attention": "llamppl.lm.hf.prefix_attention",
    "llamppl.lm.tree_mask": "llamppl.lm.hf.tree_mask",
    "llamppl.lm.trie_cache": "llamppl.lm.hf.trie_cache",
    # ------------------------------------------------------------ LLaMPPL modules, made from rows
    "llamppl.llms:CachedCausalLM": "llamppl.lm:CachedCausalLM",
    "llamppl.llms:CachedTransformer": "llamppl.lm:CachedCausalLM",
    "llamppl.llms:FunctionLM": "llamppl.lm:FunctionLM",
    "llamppl.llms:LanguageModel": "llamppl.lm:LanguageModel",
    "llamppl.llms:VLLMLM": "llamppl.lm:VLLMLM",
    "llamppl.llms:Token": "llamppl.token:Token",
    "llamppl.llms:MLX_AVAILABLE": f"{_ADAPTERS}:MLX_AVAILABLE",
    "llamppl.distributions.distribution:Distribution": "llamppl.distributions:Distribution",
    "llamppl.distributions.bernoulli:Bernoulli": "llamppl.distributions:Bernoulli",
    "llamppl.distributions.geometric:Geometric": "llamppl.distributions:Geometric",
    "llamppl.distributions.logcategorical:LogCategorical": f"{_ADAPTERS}:LogCategorical",
    "llamppl.distributions.tokencategorical:TokenCategorical": "llamppl.distributions:TokenCategorical",
    "llamppl.distributions.transformer:Transformer": "llamppl.distributions:Transformer",
    "llamppl.distributions.lmcontext:LMContext": "llamppl.context:LMContext",
    "llamppl.distributions.lmcontext:LMNextToken": "llamppl.context:LMNextToken",
    "llamppl.distributions.lmcontext:LMTokenMask": "llamppl.context:LMTokenMask",
    # ------------------------------------------------------------ names added to our modules
    # constraints, whose one home is llamppl.constraints (llamppl.models exports programs)
    "llamppl.models:Constraint": "llamppl.constraints:Constraint",
    "llamppl.models:Grammar": "llamppl.constraints:Grammar",
    "llamppl.models:make_grammar": "llamppl.decoding.grammar.engine:make_grammar",
    "llamppl.models:banned_words": "llamppl.constraints:banned_words",
    "llamppl.models:max_word_length": "llamppl.constraints:max_word_length",
    "llamppl.models:regex_prefix": "llamppl.constraints:regex_prefix",
    "llamppl.decoding.proposals.vocab_trie:TokenTrie": "llamppl.decoding.proposals.vocab_trie:VocabTrie",
    "llamppl.decoding.proposals.vocab_trie:token_trie": "llamppl.decoding.proposals.vocab_trie:vocab_trie",
    "llamppl:CachedTransformer": "llamppl.lm:CachedCausalLM",
    "llamppl:LogCategorical": f"{_ADAPTERS}:LogCategorical",
    "llamppl:smc_standard": "llamppl.inference:smc_standard",
    "llamppl:smc_steer": "llamppl.inference:smc_steer",
    "llamppl:importance_sampling": "llamppl.inference:importance_sampling",
    "llamppl:enumerate_exact": "llamppl.inference:enumerate_exact",
    "llamppl:csmc_standard": "llamppl.inference:csmc_standard",
    "llamppl:particle_gibbs": "llamppl.inference:particle_gibbs",
    "llamppl.distributions:LogCategorical": f"{_ADAPTERS}:LogCategorical",
    "llamppl.distributions:LMContext": "llamppl.context:LMContext",
    "llamppl.distributions:LMNextToken": "llamppl.context:LMNextToken",
    "llamppl.distributions:LMTokenMask": "llamppl.context:LMTokenMask",
    "llamppl.inference:StepRecord": "llamppl.inference.step_info:StepInfo",
    "llamppl.inference.result:StepRecord": "llamppl.inference.step_info:StepInfo",
    "llamppl.token:sample_index": "llamppl.row_sampling:sample_index",
    "llamppl.token:sample_row": "llamppl.row_sampling:sample_row",
    "llamppl.token:gather_row": "llamppl.row_sampling:gather_row",
    "llamppl.token:row_masses": "llamppl.row_sampling:row_masses",
    "llamppl.decoding.constraints:MaxWordLength": "llamppl.decoding.text.characters:MaxWordLength",
    "llamppl.decoding.constraints:BannedWords": "llamppl.decoding.text.characters:BannedWords",
    "llamppl.decoding.constraints:RegexPrefix": "llamppl.decoding.text.characters:RegexPrefix",
    "llamppl.decoding.constraints:max_word_length": (
        "llamppl.decoding.text.characters:max_word_length"
    ),
    "llamppl.decoding.constraints:banned_words": "llamppl.decoding.text.characters:banned_words",
    "llamppl.decoding.constraints:regex_prefix": "llamppl.decoding.text.characters:regex_prefix",
    "llamppl.decoding.grammar.json_budget:json_budget": f"{_ADAPTERS}:json_budget",
    "llamppl.decoding.grammar.compile:json_grammar": f"{_ADAPTERS}:budget_keywords",
    "llamppl.decoding.grammar.engine:make_grammar": f"{_ADAPTERS}:budget_keywords",
    "llamppl.models.structured:generate_json": f"{_ADAPTERS}:budget_keywords",
    "llamppl.inference.resampling:multinomial_resample": f"{_ENGINES}:multinomial_resample",
    "llamppl.inference.resampling:stratified_resample": f"{_ENGINES}:stratified_resample",
    "llamppl.inference.resampling:systematic_resample": f"{_ENGINES}:systematic_resample",
    "llamppl.inference.resampling:residual_resample": f"{_ENGINES}:residual_resample",
    "llamppl.inference.resampling:RESAMPLING_METHODS": f"{_ENGINES}:RESAMPLING_METHODS",
    "llamppl.inference.resampling:get_resampling_fn": f"{_ENGINES}:get_resampling_fn",
    # ------------------------------------------------------------ our names, LLaMPPL's form too
    "llamppl.inference.smc_standard:smc_standard": f"{_ENGINES}:smc_standard",
    # ------------------------------------------------------------ class attributes
    "llamppl.modeling:Model.advance": f"{_ADAPTERS}:advance",
    "llamppl.modeling:Model.begin": f"{_ADAPTERS}:begin",
    "llamppl.token:Token.token_str": f"{_ADAPTERS}:token_str",
    "llamppl.token:Token.__eq__": f"{_ADAPTERS}:token_equals_text",
    "llamppl.context:LMContext.create": f"{_ADAPTERS}:create",
    "llamppl.context:LMContext.model_mask": f"{_ADAPTERS}:model_mask",
    "llamppl.context:LMContext.s": f"{_ADAPTERS}:context_text",
    "llamppl.context:LMContext.token_count": f"{_ADAPTERS}:token_count",
    "llamppl.context:LMContext.next_token_logprobs": f"{_ADAPTERS}:next_token_logprobs",
    "llamppl.lm.base:LanguageModel.str_vocab": "llamppl.lm.base:LanguageModel.vocab",
    "llamppl.lm.base:LanguageModel.next_token_logprobs_unbatched": (
        "llamppl.lm.base:LanguageModel.next_token_logprobs_sync"
    ),
    "llamppl.lm.base:LanguageModel._next_token_logprobs_batch": (
        "llamppl.lm.base:LanguageModel.next_token_logprobs_batch"
    ),
    "llamppl.lm.base:LanguageModel.cache_kv": f"{_ADAPTERS}:cache_kv",
    "llamppl.lm.base:LanguageModel.clear_kv_cache": f"{_ADAPTERS}:clear_kv_cache",
    "llamppl.lm.base:LanguageModel.backend": f"{_ADAPTERS}:backend",
    "llamppl.lm.masks:VocabMasks.END_PUNCTUATION": "llamppl.lm.masks:VocabMasks.END_SENTENCE_PUNCT",
    "llamppl.decoding.grammar.constraint:Grammar.from_json_schema": f"{_ADAPTERS}:budget_keywords",
    "llamppl.models.grammar:GrammarConstraint.__init__": f"{_ADAPTERS}:budget_keywords",
    "llamppl.inference.result:SMCResult.__add__": f"{_ENGINES}:particles_plus",
    "llamppl.inference.result:SMCResult.__radd__": f"{_ENGINES}:plus_particles",
}
