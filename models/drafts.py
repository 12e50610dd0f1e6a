"""Self-speculative drafts: the target model with some decoder layers skipped, sharing its weights.

A draft for :func:`~llamppl.models.speculative_smc` (or :func:`~llamppl.models.specs`)
built from the target itself, so it has the target's tokenizer and vocabulary and costs
no extra memory: the kept layers, the embeddings, the final norm and the LM head are the
target's own tensors (no copy). Three ways to choose the layers:

- :func:`skip_middle_draft` keeps the first and the last layers and skips the middle ones
  (self-speculative decoding in the style of Draft & Verify). On SmolLM2-135M, keeping
  layers 0–11 and 18–29 of 30 agrees with the target far better (next-token total
  variation about 0.4–0.6) than any truncation;
- :func:`truncated_draft` keeps the first ``n_layers`` (an early exit, which SmolLM2 was
  not trained for: total variation 0.8–0.99 even with 24 of 30 layers);
- :func:`draft_from_layers` keeps any increasing list of layer indices.

::

    from llamppl import CachedCausalLM
    from llamppl.models import skip_middle_draft, truncated_draft
    target = CachedCausalLM.default()
    draft = skip_middle_draft(target, keep_first=12, keep_last=12)   # layers 0-11, 18-29
    early = truncated_draft(target, n_layers=24)                     # layers 0-23
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING

from llamppl.validation import check_nonnegative_int, check_positive_int

if TYPE_CHECKING:  # imported where used: the HF backend loads transformers
    from llamppl.lm.hf.cached_causal_lm import CachedCausalLM

__all__ = ["draft_from_layers", "skip_middle_draft", "truncated_draft"]


def _layer_count(lm: object) -> int:
    from llamppl.lm.hf.cached_causal_lm import CachedCausalLM

    if not isinstance(lm, CachedCausalLM):
        raise TypeError(f"lm must be a CachedCausalLM, got {type(lm).__name__}")
    return lm.model.config.get_text_config(decoder=True).num_hidden_layers


def draft_from_layers(lm: CachedCausalLM, layers: Sequence[int]) -> CachedCausalLM:
    """A draft that runs only the decoder ``layers`` of ``lm`` (increasing indices), in order.

    Builds a fresh Hugging Face model from ``lm.model.config`` with
    ``num_hidden_layers = len(layers)`` (and the kept layers' ``layer_types``, so
    sliding windows stay where they were), loads the embeddings, layer ``layers[j]``
    as its layer ``j``, the final norm and the LM head from ``lm.model`` — the tensors
    are shared, not copied — and wraps it in a :class:`~llamppl.CachedCausalLM` with
    ``lm``'s tokenizer. Its next-token log-probs are those of a fresh forward of
    ``lm.model`` with the other layers removed: h ← embed(x); h ← layer_i(h) for i in
    ``layers``; log softmax(head(norm(h))).
    """
    from transformers import AutoModelForCausalLM

    from llamppl.lm.hf.cached_causal_lm import CachedCausalLM

    total = _layer_count(lm)
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
        raise TypeError(f"layers must be a sequence of layer indices, got {type(layers).__name__}")
    if not layers or not all(
        isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in layers
    ):
        raise ValueError(f"layers must be a non-empty list of integers, got {list(layers)!r}")
    keep = [int(i) for i in layers]
    if any(b <= a for a, b in zip(keep, keep[1:])) or keep[0] < 0 or keep[-1] >= total:
        raise ValueError(
            f"layers must be increasing indices in [0, {total - 1}] for this model, got {keep}"
        )
    config = lm.model.config.__class__.from_dict(lm.model.config.to_dict())
    config.num_hidden_layers = len(keep)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[i] for i in keep]
    config.quantization_config = None
    config._attn_implementation = lm.model.config._attn_implementation
    param = next(lm.model.parameters())
    small = AutoModelForCausalLM.from_config(config, dtype=param.dtype).to(param.device)
    position = {i: j for j, i in enumerate(keep)}  # target layer index -> draft layer index
    state = {}
    for name, t in lm.model.state_dict().items():
        parts = name.split(".")
        if name.startswith("model.layers."):
            if int(parts[2]) not in position:
                continue
            name = ".".join([*parts[:2], str(position[int(parts[2])]), *parts[3:]])
        state[name] = t
    # assign=True: the draft's tensors ARE the target's (no copy of the shared weights)
    missing, unexpected = small.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(
            f"cannot skip layers of this model: missing {missing}, unexpected {unexpected}"
        )
    small.tie_weights()
    return CachedCausalLM(small.eval(), lm.tokenizer)


def truncated_draft(lm: CachedCausalLM, n_layers: int) -> CachedCausalLM:
    """An early-exit draft: the first ``n_layers`` decoder layers of ``lm`` (see :func:`draft_from_layers`)."""
    total = _layer_count(lm)
    n_layers = check_positive_int("n_layers", n_layers)
    if n_layers > total:
        raise ValueError(f"n_layers must lie in [1, {total}] for this model, got {n_layers}")
    return draft_from_layers(lm, range(n_layers))


def skip_middle_draft(lm: CachedCausalLM, keep_first: int, keep_last: int) -> CachedCausalLM:
    """A draft that keeps the first ``keep_first`` and the last ``keep_last`` layers of ``lm``.

    The middle layers are skipped (see :func:`draft_from_layers`); ``keep_first +
    keep_last`` must lie in [1, number of layers] (all layers: the target itself).
    """
    total = _layer_count(lm)
    first = check_nonnegative_int("keep_first", keep_first)
    last = check_nonnegative_int("keep_last", keep_last)
    if not 1 <= first + last <= total:
        raise ValueError(
            f"keep_first + keep_last must lie in [1, {total}] for this model, got {first} + {last}"
        )
    return draft_from_layers(lm, [*range(first), *range(total - last, total)])
