"""Loading and placing Hugging Face causal LMs for :class:`~llamppl.CachedCausalLM`. Never downloads.

``CachedCausalLM.from_pretrained`` and ``CachedCausalLM.default`` are thin entry
points over :func:`load_pretrained` (a local directory, a ``.gguf`` file or a
model already in the local Hugging Face cache) and :func:`load_default` (the
embedded SmolLM2-135M-Instruct, :mod:`llamppl.lm.hf.embedded`). :func:`place_model`
moves a model to the requested device and dtype (or checks that a model placed
with ``device_map`` agrees). ``device``, ``dtype`` and ``weights`` are checked first
(:func:`check_device`, :func:`check_dtype`, :func:`check_weights`), so a typo or a
device this torch build lacks is a ``ValueError`` naming the argument::

    model, tokenizer = load_pretrained("~/models/Qwen2.5-0.5B", dtype="bfloat16")
    check_device("cuda")    # ValueError on a CPU-only build: "... this torch build has: cpu"
    check_weights("auto", None, torch.float32)    # "fp16" on an x86-64 CPU, else "fp32"

``weights`` chooses how the linear layers run (:mod:`llamppl.lm.hf.fast_linear`):
``"fp32"`` as the model is, ``"fp16"`` with float16 weights and float32 activations
on the CPU (decode steps 1.2-2.4x faster, mean KL 2e-6 nats per token), ``"auto"``
the latter where it applies (a float32 model on the CPU with FBGEMM), else ``"fp32"``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "available_devices",
    "check_device",
    "check_dtype",
    "check_weights",
    "load_default",
    "load_pretrained",
    "place_model",
]

_DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64")
WEIGHTS = ("auto", "fp32", "fp16")


def available_devices() -> list[str]:
    """Device types this torch build can use here (``"cpu"`` first), e.g. ``["cpu", "cuda"]``."""
    out = ["cpu"]
    if torch.cuda.is_available():
        out.append("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        out.append("xpu")
    return out


def check_device(device: object, name: str = "device") -> torch.device | None:
    """``device`` as a ``torch.device`` (None stays None); ``TypeError``/``ValueError`` naming ``name``.

    Refuses strings torch cannot parse and devices this torch build cannot use
    (the message lists the ones it has).
    """
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"{name} must be a str, a torch.device or None, got {type(device).__name__}"
        )
    have = available_devices()
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(
            f"{name}={device!r} is not a device name (e.g. 'cpu', 'cuda', 'cuda:1'); "
            f"this torch build has: {', '.join(have)}"
        ) from exc
    if dev.type in ("cpu", "meta"):
        return dev
    if dev.type not in have:
        raise ValueError(
            f"{name}={device!r} is not available: this torch build ({torch.__version__}) "
            f"has: {', '.join(have)}"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(
            f"{name}={device!r} is not available: there are {torch.cuda.device_count()} "
            "CUDA devices (cuda:0 ...)"
        )
    return dev


def check_dtype(dtype: object, name: str = "dtype", allow_auto: bool = False) -> Any:
    """``dtype`` as a floating ``torch.dtype`` (or ``"auto"`` if allowed); errors name ``name``.

    Accepts a ``torch.dtype`` or its name (``"float32"``, ``"float16"``, ``"bfloat16"``, ...).
    """
    accepted = ("'auto', " if allow_auto else "") + ", ".join(repr(n) for n in _DTYPE_NAMES)
    if allow_auto and dtype == "auto":
        return dtype
    if isinstance(dtype, str):
        value = getattr(torch, dtype, None)
        if not isinstance(value, torch.dtype) or not value.is_floating_point:
            raise ValueError(
                f"{name}={dtype!r} is not a floating-point torch dtype; use one of {accepted} "
                "or a torch.dtype such as torch.bfloat16"
            )
        return value
    if not isinstance(dtype, torch.dtype):
        raise TypeError(
            f"{name} must be a torch.dtype or one of {accepted}, got {type(dtype).__name__}"
        )
    if not dtype.is_floating_point:
        raise ValueError(f"{name}={dtype} is not a floating-point dtype; use one of {accepted}")
    return dtype


def check_weights(weights: object, device: torch.device | None, dtype: object) -> str:
    """``weights`` resolved to a format of :mod:`llamppl.lm.hf.fast_linear` (``"fp32"`` or ``"fp16"``).

    ``"auto"`` is ``"fp16"`` for a float32 model on the CPU (``device`` None or
    ``cpu``) in a torch build with FBGEMM, else ``"fp32"`` (other devices keep
    their usual path). ``"fp16"`` elsewhere, or any other value, is a
    ``ValueError`` naming ``weights`` and the allowed values.
    """
    from .fast_linear import fp16_gemm_supported

    allowed = ", ".join(repr(w) for w in WEIGHTS)
    if not isinstance(weights, str) or weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r} is not one of {allowed}")
    on_cpu = device is None or device.type == "cpu"
    fits = on_cpu and dtype in (torch.float32, "float32") and fp16_gemm_supported()
    if weights == "auto":
        return "fp16" if fits else "fp32"
    if weights == "fp16" and not fits:
        where = "" if on_cpu else f" (device={str(device)!r})"
        raise ValueError(
            f"weights='fp16' runs a float32 model on the CPU with FBGEMM{where}, got dtype={dtype}"
            + ("" if fp16_gemm_supported() else " and a torch build without FBGEMM")
            + f"; use weights='fp32' (allowed: {allowed})"
        )
    return weights


def place_model(
    hf_model: Any, device: torch.device | None, dtype: torch.dtype | None
) -> tuple[torch.device, torch.dtype]:
    """Move ``hf_model`` (in place) to ``device``/``dtype`` (None: keep) and set eval mode.

    A model placed by ``device_map`` (accelerate) is left where it is; ``device``
    and ``dtype`` must then agree with it. Returns ``(input device, dtype)``.
    """
    param = next(hf_model.parameters())
    if getattr(hf_model, "hf_device_map", None):  # placed by accelerate: leave it
        target_device = hf_model.get_input_embeddings().weight.device
        if device is not None and device != target_device:
            raise ValueError(
                f"device={str(device)!r} conflicts with the model's device_map "
                f"(inputs on {target_device})"
            )
        if dtype is not None and dtype != param.dtype:
            raise ValueError("dtype cannot be changed for a model placed with device_map")
        target_dtype = param.dtype
    else:
        target_device = device if device is not None else param.device
        target_dtype = dtype if dtype is not None else param.dtype
        if param.device != target_device or param.dtype != target_dtype:
            hf_model.to(device=target_device, dtype=target_dtype)
    hf_model.eval()
    return target_device, target_dtype


def load_pretrained(
    path: str | os.PathLike, dtype: Any, weights: str = "fp32", **model_kwargs: Any
) -> tuple[Any, Any]:
    """``(hf_model, tokenizer)`` from a local directory, a ``.gguf`` file or the local HF cache.

    ``attn_implementation`` defaults to ``"sdpa"``; other keyword arguments go to
    ``AutoModelForCausalLM.from_pretrained``. ``weights`` is a resolved format
    (:func:`check_weights`): ``"fp16"`` swaps the linear layers after loading
    (:func:`llamppl.lm.hf.fast_linear.accelerate_linears`). Raises ``ValueError``
    naming ``path`` if it cannot be found locally.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or path, got {type(path).__name__}")
    dtype = check_dtype(dtype, allow_auto=True)
    p = Path(path).expanduser()
    kw: dict[str, Any] = {"local_files_only": True, "dtype": dtype, **model_kwargs}
    kw.setdefault("attn_implementation", "sdpa")
    tok_kw: dict[str, Any] = {"local_files_only": True}
    if p.is_file() and p.suffix == ".gguf":
        src = str(p.parent)
        kw["gguf_file"] = tok_kw["gguf_file"] = p.name
    elif p.is_dir():
        src = str(p)
    elif p.exists():
        raise ValueError(f"path {str(path)!r} is neither a model directory nor a .gguf file")
    else:
        src = str(path)  # perhaps a name in the local Hugging Face cache
    try:
        model = AutoModelForCausalLM.from_pretrained(src, **kw)
        tokenizer = AutoTokenizer.from_pretrained(src, **tok_kw)
    except (OSError, ValueError) as exc:
        if p.exists():
            raise
        raise ValueError(
            f"path {str(path)!r} does not exist and is not in the local Hugging Face cache "
            "(models are never downloaded; pass a local directory or .gguf file)"
        ) from exc
    if weights != "fp32":
        from .fast_linear import accelerate_linears

        accelerate_linears(model.eval(), weights)
    return model, tokenizer


def load_default(device: torch.device | None, dtype: Any, weights: str = "fp32") -> tuple[Any, Any]:
    """``(hf_model, tokenizer)`` of the embedded SmolLM2-135M-Instruct (weights shared per process).

    ``weights`` is a resolved format (:func:`check_weights`).
    """
    from .embedded import load_embedded

    return load_embedded(device, check_dtype(dtype), weights=weights)
