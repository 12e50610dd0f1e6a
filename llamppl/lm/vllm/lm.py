"""``VLLMLM``: a :class:`~llamppl.lm.base.LanguageModel` served by a vLLM engine.

vLLM brings tensor-parallel serving of large models, paged attention and automatic
prefix caching. All contexts awaited together (one SMC step of every particle) are
served by the engine together, in one of two modes (``live=``)::

    from llamppl.lm.vllm.lm import VLLMLM
    lm = VLLMLM.from_pretrained("/models/Llama-3.1-8B-Instruct")   # live=True
    logps = await lm.next_token_logprobs(lm.encode("The capital of France is"))  # (V,) float32
    lm.stats    # VLLMStats(engine_calls=1, requests=1, tokens_computed=6, ...)

``live=True`` (default)
    Every particle is a live engine request (a resumable vLLM request) that the
    next round extends by the token(s) the program chose: one engine step per
    round, one new token computed per particle. A resampled particle forks from
    its ancestor's K/V without recomputing it, and a particle that asks for
    nothing in a round (dead, finished, not resampled) is freed at once
    (:mod:`llamppl.lm.vllm.engine`, :mod:`llamppl.lm.vllm.port`, :mod:`llamppl.lm.vllm.fork`).
``live=False``
    Every distinct context is a new one-token request, all of a round in ONE
    ``LLM.generate`` call; vLLM's prefix cache serves the contexts' whole blocks
    and the rest of every context is recomputed.

How the full next-token distribution is read. vLLM returns sampled tokens,
not distributions, so each request generates one (throw-away) token and the
log-probs of the position before it are collected in one of two ways (``capture=``):

``"processor"``
    A vLLM v1 logits processor (:class:`vllm.v1.sample.logits_processor.LogitsProcessor`,
    registered with ``LLM(logits_processors=[...])``) sees the batch's raw logits
    ``(B, V)`` and stores ``log_softmax`` of the rows of our requests, which are
    tagged through ``SamplingParams.extra_args``: one tensor per engine step, on the
    engine's device. Fastest; the processor must run in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one GPU).
``"logprobs"``
    vLLM's documented output path: ``SamplingParams(logprobs=-1)`` (engine built
    with ``max_logprobs=-1``) returns every token's log-prob, scattered into
    ``(V,)`` vectors on the CPU. Works with any engine layout (tensor parallel,
    multiprocess), at the cost of vLLM sorting and shipping ``V`` values per request.

Both give ``log_softmax`` of the model's raw logits (vLLM's default
``logprobs_mode="raw_logprobs"``), i.e. the normalised next-token log-probs
p(x_{t+1} | x_{1:t}) of the LM, in float32.

With ``"processor"`` the LM's final hidden state after a context (the LM head's input,
what a learned twist's ``hidden_state()`` feature reads) comes from the same engine step:
:meth:`VLLMLM.next_token_hidden` (:func:`~llamppl.lm.vllm.port.install_hidden_capture`
wraps the model's ``compute_logits`` so the processor keeps the rows it was given).

With ``live=False`` the engine object may be anything with vLLM's offline interface
(``generate(prompts, sampling_params, use_tqdm=...)`` returning request outputs
with ``.outputs[0].logprobs`` and ``.num_cached_tokens``, and ``get_tokenizer()``);
with ``live=True`` it needs ``llm.llm_engine``'s ``engine_core`` and
``input_processor`` (:class:`~llamppl.lm.vllm.port.CorePort`). The unit tests use fakes of both.
"""

from __future__ import annotations

import itertools
import os
import uuid
import weakref
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from ...validation import check_nonnegative_int, is_integer
from ..base import validate_token_ids
from ..hf_vocab import HFTokenizerLM
from ..memo import LRU
from .engine import LiveSessions, VLLMStats
from .load import CAPTURE_MODES, build_engine, import_vllm
from .port import (
    CAPTURE_TAG,
    CorePort,
    captured_hidden,
    captured_rows,
    forget_captured,
    install_hidden_capture,
    processor_class,
)

__all__ = ["VLLMLM", "VLLMStats", "import_vllm"]


class VLLMLM(HFTokenizerLM):
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
        (e.g. by ``mask_dist`` then ``next_token``) costs no engine call
        (``live=False``; also how many hidden states, :meth:`next_token_hidden`).
    sampling_params : type | None
        The request-parameters class. Default: ``vllm.SamplingParams``.
    live : bool
        ``True`` (default): every particle is a live engine request extended by its
        next token each round (:mod:`llamppl.lm.vllm.engine`); a resampled particle
        forks from its ancestor's K/V (through the fork connector that
        :meth:`from_pretrained` installs; without it a fork recomputes its last
        partial block), and a particle that stops asking is freed at the end of the
        round. ``False``: every context is a new one-token request (one
        ``LLM.generate`` call per round; vLLM's prefix cache serves whole blocks).
    idle_rounds : int
        ``live=True``: rounds a particle's request may go unasked before it is freed
        (0: at once; see :class:`~llamppl.lm.vllm.engine.LiveSessions`).

    Attributes
    ----------
    llm, tokenizer
        The wrapped vLLM engine and its tokenizer.
    stats : VLLMStats
        Work counters.
    """

    def __init__(
        self,
        llm: Any,
        capture: str = "logprobs",
        tokenizer: Any = None,
        vocab_size: int | None = None,
        max_cached_logprobs: int = 256,
        sampling_params: type | None = None,
        live: bool = True,
        idle_rounds: int = 0,
    ) -> None:
        if not callable(getattr(llm, "generate", None)):
            raise TypeError(f"llm must be a vllm.LLM engine, got {type(llm).__name__}")
        if capture not in CAPTURE_MODES:
            raise ValueError(f"capture must be one of {CAPTURE_MODES}, got {capture!r}")
        if not isinstance(live, bool):
            raise TypeError(f"live must be True or False, got {live!r}")
        if tokenizer is None:
            tokenizer = llm.get_tokenizer()
        if vocab_size is None:
            vocab_size = int(llm.llm_engine.model_config.get_vocab_size())
        if not is_integer(vocab_size) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        hf_config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
        hf_config = getattr(hf_config, "hf_config", None) or SimpleNamespace(eos_token_id=None)
        gen_config = SimpleNamespace(eos_token_id=getattr(hf_config, "eos_token_id", None))
        model = SimpleNamespace(config=hf_config, generation_config=gen_config)
        super().__init__(tokenizer, vocab_size, model, max_cached_logprobs)
        self.llm = llm
        self.capture = capture
        self._tag_prefix = uuid.uuid4().hex
        self._counter = itertools.count()
        self._params_cls = sampling_params
        self.stats: VLLMStats = VLLMStats()
        self.live = live
        # Why next_token_hidden cannot work here (None: it can); live=False keeps the hidden
        # states of recent contexts beside logprob_memo, live=True on the lanes.
        self._hidden_unavailable: str | None = (
            install_hidden_capture(llm)
            if capture == "processor"
            else "capture='logprobs' returns log-probs only"
        )
        self._hidden_memo: LRU[tuple[int, ...], torch.Tensor] = LRU(max_cached_logprobs)
        self._sessions: LiveSessions | None = None
        if live:
            if getattr(getattr(llm, "llm_engine", None), "engine_core", None) is None:
                raise TypeError(
                    "live=True needs vLLM's v1 engine (llm.llm_engine.engine_core); "
                    f"{type(llm).__name__} has none: pass live=False"
                )
            port = CorePort(llm, capture, vocab_size, self._tag_prefix, sampling_params)
            idle_rounds = check_nonnegative_int("idle_rounds", idle_rounds)
            self._sessions = LiveSessions(port, self._tag_prefix, self.stats, idle_rounds)
            # the engine outlives this object: free its live requests when it goes
            weakref.finalize(self, self._sessions.release)

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
        live: bool = True,
        idle_rounds: int = 0,
        **engine_kwargs: Any,
    ) -> VLLMLM:
        """Build a vLLM engine for the model in the local directory ``path``. Never downloads.

        Prefix caching is always on. With ``tensor_parallel_size == 1`` the engine
        runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the
        environment says otherwise: start-up ~5 s instead of ~25 s) and ``capture``
        defaults to ``"processor"``; otherwise to ``"logprobs"``. On a machine without CUDA the CPU defaults
        ``enforce_eager=True, block_size=32`` apply unless given. Other keyword
        arguments (``max_model_len``, ``enforce_eager``, ...) go to ``vllm.LLM``
        (:func:`llamppl.lm.vllm.load.build_engine`). With ``live=True`` it installs the fork
        connector :mod:`llamppl.lm.vllm.fork`, which turns vLLM's hybrid K/V allocator off:
        for a hybrid SSM model (Jamba, Bamba) pass ``kv_transfer_config=None`` (forks then
        recompute their last partial block) or ``live=False``.
        """
        llm, capture = build_engine(
            path,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            capture=capture,
            capture_processor=processor_class,
            fork_connector=live,
            **engine_kwargs,
        )
        return cls(
            llm,
            capture=capture,
            max_cached_logprobs=max_cached_logprobs,
            live=live,
            idle_rounds=idle_rounds,
        )

    # ------------------------------------------------------------------ interface
    @property
    def device(self) -> torch.device:
        """Device of the returned log-probs: the engine's with ``capture="processor"``, else CPU."""
        if self.capture == "logprobs":
            return torch.device("cpu")
        config = getattr(getattr(self.llm, "llm_engine", None), "vllm_config", None)
        dev = getattr(getattr(config, "device_config", None), "device", None)
        return torch.device(dev) if dev is not None else torch.device("cpu")

    def release(self) -> None:
        """Free the live engine requests (``live=True``); the next round starts new ones."""
        if self._sessions is not None:
            self._sessions.release()

    def clear_cache(self) -> None:
        """Free the live requests, forget memoised rows and reset the engine's prefix cache."""
        self.release()
        self.logprob_memo.clear()
        self._hidden_memo.clear()
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if callable(reset):
            reset()

    # ------------------------------------------------------------------ hidden states
    @property
    def hidden_size(self) -> int:
        """Width D of the final hidden state (:meth:`next_token_hidden`)."""
        self._check_hidden()
        return int(self.llm.llm_engine.model_config.get_hidden_size())

    async def next_token_hidden(self, token_ids: Sequence[int]) -> torch.Tensor:
        """The final hidden state ``(D,)`` float32 after ``token_ids``: the LM head's input,
        from which :meth:`next_token_logprobs` is computed.

        It is the row the engine step behind :meth:`next_token_logprobs` computes anyway,
        captured with its log-probs (``capture="processor"``, engine in this process), so
        no second pass: a served context (a live request's, or one of the last
        ``max_cached_logprobs`` with ``live=False``) costs a lookup, a new one its share of
        the engine step of every context awaited with it; its log-probs are then served too.
        """
        self._check_hidden()
        ids = validate_token_ids(token_ids, self.vocab_size)
        hidden = self._served_hidden(ids)
        if hidden is None:
            await self.next_token_logprobs(ids)  # coalesced with the contexts awaited now
            hidden = self._served_hidden(ids)
        if hidden is None:  # its log-probs came from a memo without it: serve it again
            self.stats.batch_calls += 1
            if self._sessions is not None:
                self._sessions.run([ids], free_unused=False)
            else:
                self._run_engine([ids])
            hidden = self._served_hidden(ids)
        if hidden is None:
            raise RuntimeError(
                f"the vLLM engine step gave no hidden state for a {len(ids)}-token context "
                "(its compute_logits rows differed from its logits rows, or "
                "max_cached_logprobs=0 with live=False)"
            )
        return hidden.to(torch.float32, copy=True)  # never the step's own tensor

    def _served_hidden(self, ids: tuple[int, ...]) -> torch.Tensor | None:
        """The hidden state kept for ``ids`` (its live request's, or memoised), or None."""
        if self._sessions is None:
            return self._hidden_memo.get(ids)
        lane = self._sessions.lanes.get(ids)
        return None if lane is None else lane.hidden

    def _check_hidden(self) -> None:
        if self._hidden_unavailable is not None:
            raise TypeError(
                f"VLLMLM has no hidden states here: {self._hidden_unavailable}. Use "
                "capture='processor' with the engine in this process "
                "(VLLMLM.from_pretrained with tensor_parallel_size=1 does), or CachedCausalLM; "
                "a learned twist without them reads last_token(), constraint_signals(), "
                "progress() or repetition() instead of hidden_state()"
            )

    # ------------------------------------------------------------------ batching
    def _serve(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """With ``live=True`` a round is ONE backend call whatever ``batch_size`` says: the
        round decides which live requests to free, and vLLM batches the work itself
        (``max_num_batched_tokens``)."""
        if self._sessions is None:
            return super()._serve(contexts)
        unique = list(dict.fromkeys(contexts))
        self.stats.batch_calls += 1
        rows = dict(zip(unique, self.next_token_logprobs_batch(unique)))
        return [rows[c] for c in contexts]

    def next_token_logprobs_sync(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Blocking single-context version of :meth:`next_token_logprobs`; with ``live=True``
        it frees no other particle's request (a lone call amid a run is not a round)."""
        if self._sessions is None:
            return super().next_token_logprobs_sync(token_ids)
        ids = validate_token_ids(token_ids, self.vocab_size)
        if not ids:
            raise ValueError(
                "token_ids must be non-empty: a causal LM needs at least one token to condition on"
            )
        self.stats.batch_calls += 1
        return self._check_row(self._sessions.run([ids], free_unused=False)[0])

    def next_token_logprobs_batch(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        for c in contexts:
            if len(c) == 0:
                raise ValueError(
                    "token_ids must be non-empty: a causal LM needs at least one token to condition on"
                )
        if self._sessions is not None:  # live requests: the lanes hold the latest rows
            return [self._check_row(r) for r in self._sessions.run(contexts)]
        results: dict[tuple[int, ...], torch.Tensor] = {}
        todo = []
        for c in contexts:
            hit = self.logprob_memo.get(c)
            if hit is not None:
                results[c] = hit
                self.stats.cache_hits += 1
            else:
                todo.append(c)
        if todo:
            for c, row in zip(todo, self._run_engine(todo)):
                results[c] = row
                self.logprob_memo.put(c, row)
        return [results[c] for c in contexts]

    def _run_engine(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """ONE ``generate`` call: a one-token request per context; returns ``(V,)`` float32 rows."""
        if self._params_cls is None:
            self._params_cls = import_vllm().SamplingParams
        SamplingParams = self._params_cls  # noqa: N806

        tags = [f"{self._tag_prefix}-{next(self._counter)}" for _ in contexts]
        common = {"max_tokens": 1, "n": 1, "detokenize": False, "ignore_eos": True}
        if self.capture == "processor":
            params = [SamplingParams(**common, extra_args={CAPTURE_TAG: t}) for t in tags]
        else:
            params = SamplingParams(**common, logprobs=-1, flat_logprobs=True)
        prompts = [{"prompt_token_ids": list(c)} for c in contexts]
        try:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
            self.stats.forward_calls += 1
            if len(outputs) != len(contexts):
                raise RuntimeError(
                    f"vLLM returned {len(outputs)} outputs for {len(contexts)} requests"
                )
            if self.capture == "processor":
                rows = self._collect_captured(tags)
                for c, hidden in zip(contexts, captured_hidden(tags)):
                    if hidden is not None:  # its own copy too, as the row
                        self._hidden_memo.put(c, hidden.clone())
            else:
                rows = [self._row_from_logprobs(out) for out in outputs]
        finally:
            if self.capture == "processor":
                forget_captured(tags)
        self.stats.requests += len(contexts)
        for c, out in zip(contexts, outputs):
            cached = int(getattr(out, "num_cached_tokens", 0) or 0)
            self.stats.prefix_cached_tokens += cached
            self.stats.tokens_run += len(c) - cached
        return rows

    def _collect_captured(self, tags: list[str]) -> list[torch.Tensor]:
        rows = captured_rows(tags)
        if any(r is None for r in rows):
            raise RuntimeError(
                "the vLLM logits processor captured no log-probs: the engine does not run in "
                "this process (set VLLM_ENABLE_V1_MULTIPROCESSING=0 before importing vllm, "
                "use tensor_parallel_size=1) or use capture='logprobs'"
            )
        # Each row is its own copy, so a memoised row never keeps its whole step alive.
        return [self._check_row(r.clone()) for r in rows]  # type: ignore[union-attr]

    def _row_from_logprobs(self, output: Any) -> torch.Tensor:
        """Scatter the returned full-vocabulary log-probs of the one generated position."""
        lp = output.outputs[0].logprobs
        if not lp:
            raise RuntimeError("vLLM returned no logprobs; the engine needs max_logprobs=-1")
        ids, vals = _position_logprobs(lp, 0)
        row = torch.full((self.vocab_size,), float("-inf"), dtype=torch.float32)
        row[torch.as_tensor(ids, dtype=torch.long)] = torch.as_tensor(vals, dtype=torch.float32)
        return self._check_row(row)

    def _check_row(self, row: torch.Tensor) -> torch.Tensor:
        if row.shape != (self.vocab_size,):
            raise RuntimeError(
                f"vLLM returned a log-prob vector of shape {tuple(row.shape)}, "
                f"expected ({self.vocab_size},)"
            )
        return row


def _position_logprobs(logprobs: Any, position: int) -> tuple[list[int], list[float]]:
    """Token ids and log-probs of one generated position, from vLLM's flat or list form."""
    if hasattr(logprobs, "start_indices"):  # FlatLogprobs: one flat list over positions
        lo, hi = logprobs.start_indices[position], logprobs.end_indices[position]
        return list(logprobs.token_ids[lo:hi]), list(logprobs.logprobs[lo:hi])
    entry = logprobs[position]  # dict[token_id, Logprob]
    return list(entry.keys()), [v.logprob for v in entry.values()]
