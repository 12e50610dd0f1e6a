"""What the token-trie cache needs to know about a Hugging Face architecture.

:class:`~llamppl.CachedCausalLM` runs the model's own decoder with a K/V pool
standing in for its cache, a 4-D tree mask and explicit positions, and applies
the output head itself. That is exact only if the architecture's attention
depends on nothing but positions and the mask, and its head on nothing but the
final hidden state. This module reads those facts from the config and from one
probe forward, never from a list of model names:

- **Attention windows per layer.** ``config.layer_types`` ("full_attention" /
  "sliding_attention", as Gemma 2/3, Qwen2, GPT-OSS, Cohere2 use) or a single
  ``config.sliding_window`` for every layer (Mistral, Mixtral, Phi-3,
  Starcoder2). A windowed layer gets its own mask: key k is visible from query
  q iff ``pos(q) - pos(k) < window`` (transformers' sliding-window overlay).
  Models with mixed layers take a ``{layer type: mask}`` dict (their forward
  accepts it); a model with mixed layers whose forward does not is refused.
- **Layers that are not attention** (convolutions, linear attention, state
  space layers, chunked attention) are refused: their state is not per-token K/V.
- **Position schemes bound to key columns** (ALiBi; GPT-Neo's local layers)
  are refused: a pooled row's columns are not its tokens' positions.
- **The cache argument's name** (``cache`` from transformers 5.24,
  ``past_key_values`` before) comes from the forward signature
  (:func:`~llamppl.lm.hf.api.cache_keyword`), once, here.
- **K/V shapes** come from a one-token probe through a ``DynamicCache``:
  multi-query heads (Falcon), different K and V widths (multi-head latent
  attention), per-layer devices.
- **Output head.** ``lm_head`` followed by the config's logit transforms:
  ``logits_scaling`` (divide, Granite), ``logit_scale`` (multiply, Cohere),
  ``final_logit_softcapping`` (tanh cap, Gemma 2/3).

Attention soft-capping and query scaling (Gemma 2's ``attn_logit_softcapping``
and ``query_pre_attn_scalar``) live inside the attention modules, which run
unchanged, so they need nothing here. Whatever this module misses, the
construction-time probe in :mod:`llamppl.lm.hf.cached_causal_lm` catches: it
compares cached log-probs with a fresh forward and refuses the model if they
differ.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from .api import cache_keyword

__all__ = ["Architecture", "inspect_architecture"]

_ATTENTION = {"full_attention": None, "sliding_attention": "window"}


@dataclass(frozen=True)
class Architecture:
    """Facts about a model that the cached forward needs.

    ``windows[l]`` is layer l's attention window (None = full causal); ``mask_keys``
    are the layer types to pass a mask dict for (None: pass one mask).
    ``k_shape``/``v_shape`` are ``(heads, head_dim)`` of one token's K and V;
    ``layer_devices[l]`` is where layer l's K/V live; ``cache_keyword`` is the name
    under which the base model's forward takes its cache.
    """

    name: str
    windows: tuple[int | None, ...]
    layer_types: tuple[str, ...] | None
    k_shape: tuple[int, int]
    v_shape: tuple[int, int]
    layer_devices: tuple[torch.device, ...]
    logit_divide: float | None
    logit_multiply: float | None
    logit_softcap: float | None
    cache_keyword: str

    @property
    def mask_is_dict(self) -> bool:
        return self.layer_types is not None and len(set(self.windows)) > 1

    def transform_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The config's logit transforms applied to ``lm_head``'s output: multiply, divide, tanh cap."""
        if self.logit_multiply is not None:
            logits = logits * self.logit_multiply
        if self.logit_divide is not None:
            logits = logits / self.logit_divide
        if self.logit_softcap:
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        return logits


def _refuse(name: str, reason: str) -> ValueError:
    return ValueError(f"CachedCausalLM cannot serve {name} exactly: {reason}")


def _layer_windows(config: Any, name: str) -> tuple[tuple[int | None, ...], tuple[str, ...] | None]:
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None:
        types = tuple(types)
        bad = sorted({t for t in types if t not in _ATTENTION})
        if bad:
            raise _refuse(
                name,
                f"layer types {bad} are not full or sliding-window attention "
                "(their state is not per-token keys and values)",
            )
        if "sliding_attention" in types and not isinstance(window, int):
            raise _refuse(name, "sliding_attention layers without an integer config.sliding_window")
        return tuple(window if t == "sliding_attention" else None for t in types), types
    if getattr(config, "attention_layers", None) and "local" in config.attention_layers:
        raise _refuse(
            name,
            "its local attention layers mask by key column, and a pooled row's columns are not positions",
        )
    if isinstance(window, int):
        return (window,) * n, None
    return (None,) * n, None


def _check_positions(config: Any, name: str) -> None:
    attn_config = getattr(config, "attn_config", None)
    alibi = getattr(config, "alibi", False) or (
        getattr(attn_config, "alibi", False) if attn_config is not None else False
    )
    if alibi or getattr(config, "model_type", "") == "bloom":
        raise _refuse(
            name,
            "ALiBi position biases are built from key columns or a 2-D padding mask, "
            "which a pooled tree batch does not have",
        )


def _accepts_mask_dict(base_model: torch.nn.Module) -> bool:
    try:
        src = inspect.getsource(type(base_model).forward)
    except (OSError, TypeError):
        return False
    return "attention_mask, dict)" in src


def _probe_kv(base_model: torch.nn.Module, device: torch.device, name: str, key: str):
    """Shapes and devices of one token's K/V per layer, from a real one-token forward
    that passes the cache as ``key``."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    ids = torch.zeros((1, 1), dtype=torch.long, device=device)
    with torch.inference_mode():
        base_model(
            input_ids=ids,
            position_ids=torch.zeros_like(ids),
            use_cache=True,
            **{key: cache},
        )
    layers = getattr(cache, "layers", None)
    if not layers or any(getattr(layer, "keys", None) is None for layer in layers):
        raise _refuse(name, "its cache holds something other than per-layer keys and values")
    k_shapes = {(lay.keys.shape[1], lay.keys.shape[3]) for lay in layers}
    v_shapes = {(lay.values.shape[1], lay.values.shape[3]) for lay in layers}
    if len(k_shapes) != 1 or len(v_shapes) != 1:
        raise _refuse(name, f"K/V shapes differ between layers ({sorted(k_shapes | v_shapes)})")
    devices = tuple(lay.keys.device for lay in layers)
    return k_shapes.pop(), v_shapes.pop(), devices


def inspect_architecture(hf_model: Any, device: torch.device) -> Architecture:
    """Read the facts above from ``hf_model``; ``ValueError`` naming the reason if it cannot be served."""
    config = hf_model.config.get_text_config(decoder=True)
    name = f"{type(hf_model).__name__} (model_type {getattr(config, 'model_type', '?')!r})"
    _check_positions(config, name)
    windows, types = _layer_windows(config, name)
    if types is not None and len(set(windows)) > 1 and not _accepts_mask_dict(hf_model.base_model):
        raise _refuse(name, "it mixes windowed and full layers but takes one attention mask")
    try:
        key = cache_keyword(hf_model.base_model)
    except ValueError as err:
        raise _refuse(name, str(err)) from None
    k_shape, v_shape, devices = _probe_kv(hf_model.base_model, device, name, key)
    if len(devices) != len(windows):
        raise _refuse(name, f"{len(devices)} cache layers for {len(windows)} decoder layers")
    divide = getattr(config, "logits_scaling", None)
    multiply = getattr(config, "logit_scale", None)
    return Architecture(
        name=name,
        windows=windows,
        layer_types=types,
        k_shape=k_shape,
        v_shape=v_shape,
        layer_devices=devices,
        logit_divide=float(divide) if divide not in (None, 1, 1.0) else None,
        logit_multiply=float(multiply) if multiply not in (None, 1, 1.0) else None,
        logit_softcap=getattr(config, "final_logit_softcapping", None) or None,
        cache_keyword=key,
    )
