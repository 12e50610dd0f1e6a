"""LLaMPPL's spellings of the core (language models, ``Token``, ``LMContext``, ``Model``) as thin adapters.

Each adapter is the value of one row of :data:`llamppl.compat.table.ALIASES` and is written
with our public API only; :mod:`llamppl.compat` sets it where the row says::

    ctx = await LMContext.create(lm, "The Fed says")   # LLaMPPL's async constructor
    ctx.model_mask = {0, 1, 2}                         # LLaMPPL's pending-mask attribute
    np.asarray(ctx.next_token_logprobs)                # LLaMPPL's array form (ours is awaited)

Other spellings of ours live here too: the five JSON-budget keywords, accepted beside
``budget=`` by every function that compiles a JSON Schema (:func:`budget_keywords`)::

    generate_json(lm, prompt, schema, max_string_length=64)   # = budget=JSONBudget(max_string_length=64)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from llamppl.compat import second_form

__all__ = [
    "MLX_AVAILABLE",
    "LogCategorical",
    "advance",
    "begin",
    "token_str",
    "token_equals_text",
    "create",
    "model_mask",
    "context_text",
    "token_count",
    "ContextLogprobs",
    "next_token_logprobs",
    "cache_kv",
    "clear_kv_cache",
    "BackendName",
    "backend",
    "BUDGET_KEYWORDS",
    "json_budget",
    "budget_keywords",
]

#: ``llamppl.llms.MLX_AVAILABLE``: there is no MLX backend, so peer code takes its other path.
MLX_AVAILABLE = False


def LogCategorical(logits: Sequence[float]) -> Any:
    """LLaMPPL's ``LogCategorical(logits)``: our ``Categorical(logits=logits)``."""
    from llamppl.distributions import Categorical

    return Categorical(logits=logits)


# ---------------------------------------------------------------------- Model
def advance(model: Any) -> Any:
    """Alias of ``Model.run_step()`` (one call of ``step``; await it)."""
    return model.run_step()


def begin(model: Any) -> Any:
    """Alias of ``Model.run_start()`` (the ``start`` hook; await it)."""
    return model.run_start()


# ---------------------------------------------------------------------- Token
@property
def token_str(token: Any) -> str:
    """LLaMPPL's ``token.token_str``: ``str(token)``, the token's text."""
    return str(token)


@second_form
def token_equals_text(ours: Any) -> Any:
    """LLaMPPL's ``token == "text"``: a token also equals its text (``str(token)``)."""

    def __eq__(token: Any, other: object) -> bool:
        if isinstance(other, str):
            return str(token) == other
        return ours(token, other)

    __eq__.__doc__ = ours.__doc__
    return __eq__


# ---------------------------------------------------------------------- LMContext
@classmethod
async def create(
    cls: type, lm: Any, prompt: str | Sequence[int], temp: float = 1.0, **kw: Any
) -> Any:
    """LLaMPPL's async constructor: ``await LMContext.create(lm, prompt, temp)`` is ``LMContext(lm, prompt, temp)``."""
    return cls(lm, prompt, temp, **kw)


def _get_model_mask(context: Any) -> frozenset[int]:
    from llamppl.lm.masks import TokenSet

    mask = context.pending_mask
    return context.lm.masks.ALL_TOKENS if mask is None else TokenSet.from_tensor(mask)


def _set_model_mask(context: Any, mask: Iterable[int] | torch.Tensor) -> None:
    context.pending_mask = mask


model_mask = property(
    _get_model_mask,
    _set_model_mask,
    doc="LLaMPPL's ``context.model_mask``: the ids the next token may take (our ``pending_mask``, "
    "as a set; every id when none is pending). Assigning it (ids, a ``(V,)`` bool tensor or an "
    "``lm.masks`` set) sets ``pending_mask``.",
)


@property
def context_text(context: Any) -> str:
    """hfppl's ``context.s``: ``str(context)``."""
    return str(context)


@property
def token_count(context: Any) -> int:
    """LLaMPPL's ``context.token_count``: ``len(context.generated)``."""
    return len(context.generated)


class ContextLogprobs:
    """``context.next_token_logprobs`` in both of its forms.

    Called, it is ours: ``await context.next_token_logprobs()`` gives the tempered log-probs
    ``(V,)`` ignoring a pending mask, batched with the other particles' requests. Read as an
    array (``np.asarray``, indexing, ``len``), it is LLaMPPL's attribute: the same vector with
    the pending mask applied and renormalised, computed by one blocking request.
    """

    def __init__(self, context: Any, ours: Any) -> None:
        self.context = context
        self.ours = ours

    def __call__(self) -> Any:
        return self.ours(self.context)

    def tensor(self) -> torch.Tensor:
        """LLaMPPL's array as a ``(V,)`` float tensor (tempered, masked, renormalised)."""
        ctx = self.context
        lp = ctx.lm.next_token_logprobs_sync(ctx.tokens)
        if ctx.temp != 1.0:
            lp = torch.log_softmax(lp / ctx.temp, dim=-1)
        mask = ctx.pending_mask
        if mask is not None:
            lp = torch.log_softmax(lp.masked_fill(~mask, -math.inf), dim=-1)
        return lp

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        out = self.tensor().detach().cpu().numpy()
        return out if dtype is None else out.astype(dtype)

    def __getitem__(self, index: Any) -> Any:
        return self.__array__()[index]

    def __len__(self) -> int:
        return self.context.lm.vocab_size


@second_form
def next_token_logprobs(ours: Any) -> property:
    """Our ``await context.next_token_logprobs()`` that also reads as LLaMPPL's array attribute."""
    return property(lambda context: ContextLogprobs(context, ours), doc=ContextLogprobs.__doc__)


# ---------------------------------------------------------------------- language models
def cache_kv(lm: Any, prompt_tokens: Sequence[int]) -> None:
    """LLaMPPL's ``lm.cache_kv(ids)``: warm the cache with a prompt (ours caches automatically)."""
    lm.next_token_logprobs_sync(prompt_tokens)


def clear_kv_cache(lm: Any) -> None:
    """LLaMPPL's ``lm.clear_kv_cache()``: our ``lm.clear_cache()``, which clears the KV and the
    log-probs together (they live in the same trie nodes); an LM without a cache does nothing."""
    clear = getattr(lm, "clear_cache", None)
    if clear is not None:
        clear()


class BackendName:
    """LLaMPPL's ``lm.backend``: ``"hf"``, ``"vllm"``, ``"function"``, else ``"custom"``.

    Read on the class too (``CachedCausalLM.backend == "hf"``); a subclass or an instance may
    set its own value. Peer programs branch on it (``if lm.backend == "hf": lm.batch_size = 40``).
    """

    def __get__(self, lm: Any, cls: type) -> str:
        from llamppl.lm import VLLMLM, CachedCausalLM, FunctionLM

        for base, name in ((CachedCausalLM, "hf"), (VLLMLM, "vllm"), (FunctionLM, "function")):
            if issubclass(cls, base):
                return name
        return "custom"


backend = BackendName()


# ---------------------------------------------------------------------- the JSON budget's keywords
#: The fields of ``JSONBudget`` that functions compiling a JSON Schema took as keywords.
BUDGET_KEYWORDS = (
    "whitespace",
    "max_string_length",
    "max_array_items",
    "closed_objects",
    "max_decimals",
)


def json_budget(budget: Any = None, **keywords: Any) -> Any:
    """The budget asked for by ``budget=`` or by the separate keywords (not both).

    A helper of ours served by the compatibility table: ``json_budget(None, **keywords)`` is
    ``JSONBudget(**keywords)``; a keyword left at its default counts as not given, so
    ``budget`` and a keyword that differs from its default together are a ``ValueError``;
    a ``budget`` that is not a ``JSONBudget`` is a ``TypeError``.
    """
    from llamppl.decoding.grammar.json_budget import DEFAULT_BUDGET, JSONBudget, as_budget

    unknown = sorted(set(keywords) - set(BUDGET_KEYWORDS))
    if unknown:
        raise TypeError(f"json_budget() got unexpected keyword arguments {unknown}")
    if budget is None:
        return JSONBudget(**keywords)
    budget = as_budget(budget)
    changed = sorted(k for k, v in keywords.items() if v != getattr(DEFAULT_BUDGET, k))
    if changed:
        raise ValueError(
            f"give budget= or the keywords {changed}, not both "
            "(set them on the JSONBudget: dataclasses.replace(budget, ...))"
        )
    return budget


@second_form
def budget_keywords(ours: Any) -> Any:
    """Our function (or ``__init__``, or classmethod) taking ``budget=``, accepting the five
    budget keywords as well: they become ``budget=``
    (:func:`json_budget`'s rules); every other argument passes through unchanged."""
    if isinstance(ours, classmethod):
        return classmethod(_with_budget_keywords(ours.__func__))
    return _with_budget_keywords(ours)


def _with_budget_keywords(ours: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(ours)
    def with_budget_keywords(*args: Any, **kwargs: Any) -> Any:
        old = {k: kwargs.pop(k) for k in BUDGET_KEYWORDS if k in kwargs}
        if old:
            kwargs["budget"] = json_budget(kwargs.get("budget"), **old)
        return ours(*args, **kwargs)

    return with_budget_keywords
