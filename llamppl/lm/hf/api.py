"""The names of the transformers API that llamppl passes or reads, decided once per model.

transformers renames arguments between releases and keeps the old spelling for a
while behind a ``FutureWarning`` shim (5.24 renamed the forward argument
``past_key_values`` to ``cache`` and the model output's field likewise). llamppl
never passes a deprecated spelling: it reads the model's own ``forward`` signature
when it loads the model and uses the name found there for every later call, so
the same code runs warning-free on the oldest and on the newest supported release::

    from llamppl.lm.hf.api import cache_keyword, output_cache

    key = cache_keyword(model.base_model)                      # "cache" or "past_key_values"
    out = model.base_model(input_ids=ids, **{key: cache}, use_cache=True)
    cache = output_cache(out)

Every other transformers internal llamppl touches (``config._attn_implementation``,
``AttentionInterface``, ``AttentionMaskInterface``, ``Cache``/``DynamicLayer``) is
stable across the range in ``pyproject.toml``; ``scripts/test.sh --oldest`` and
``--latest`` check both ends.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["CACHE_KEYWORDS", "cache_keyword", "output_cache"]

#: Spellings of the KV-cache forward argument, newest first.
CACHE_KEYWORDS = ("cache", "past_key_values")


def cache_keyword(module: Any) -> str:
    """The name under which ``module.forward`` takes its KV cache, newest spelling first.

    ``inspect.signature`` follows ``functools.wraps`` through transformers'
    ``deprecate_kwarg`` shim to the real parameters, so a release that still
    accepts the old name with a warning answers with the new one. ``ValueError``
    when the forward takes neither (the model cannot be served from a KV cache).
    """
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError) as err:  # a C-implemented or otherwise opaque forward
        raise ValueError(
            f"cannot read the forward signature of {type(module).__name__}: {err}"
        ) from err
    for name in CACHE_KEYWORDS:
        if name in params:
            return name
    raise ValueError(
        f"{type(module).__name__}.forward takes no KV cache argument "
        f"(looked for {' or '.join(CACHE_KEYWORDS)})"
    )


def output_cache(output: Any) -> Any:
    """The cache a forward returned (``output.cache``, or ``past_key_values`` before 5.24)."""
    for name in CACHE_KEYWORDS:
        value = getattr(output, name, None)
        if value is not None:
            return value
    return None
