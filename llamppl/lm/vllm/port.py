"""The adapter between :class:`~llamppl.lm.vllm.engine.LiveSessions` and vLLM's v1 engine core.

:class:`CorePort` drives the engine core that ``vllm.LLM`` holds
(``llm.llm_engine.engine_core``: ``add_request``, ``abort_requests``, ``get_output``),
the same client ``LLMEngine.step`` uses, in process or not. Every particle's request
is *resumable* (vLLM's streaming-input sessions): it generates one throw-away
token (greedy, ``max_tokens=1``), then waits for its next input chunk with its
K/V kept; the next chunk is the token(s) our program chose, and vLLM drops the
throw-away token before appending it. The next-token distribution is read in one
of two ways (``capture``):

``"processor"``
    the in-process logits processor of :mod:`llamppl.lm.vllm.lm` stores
    ``log_softmax`` of the step's tagged rows as ONE ``(k, V)`` tensor on the
    engine's device; each request's row is a view of it.
``"logprobs"``
    ``SamplingParams(logprobs=-1)``: the engine returns every token's log-prob
    as numpy arrays (any engine layout, e.g. tensor parallel); the step's rows
    are scattered into one ``(k, V)`` CPU tensor (no Python floats).

With ``"processor"``, :func:`install_hidden_capture` also lets the processor store the
rows' final hidden states (the LM head's input) beside their log-probs: vLLM's model
runner calls ``model.compute_logits(hidden)`` on exactly the rows the logits processors
then see, in the same order, so a wrapper of ``compute_logits`` keeps ``hidden`` for the
processor of the same step (one ``(k, D)`` tensor per step, :data:`CAPTURED_HIDDEN`).

Example (what ``VLLMLM(llm, live=True)`` builds)::

    port = CorePort(llm, capture="processor", vocab_size=49152, tag_prefix="abc")
    port.start("abc-1", (1, 2, 3), fork_of=None, fork_tokens=0)
    ids, rows, hidden, computed = port.step()  # ["abc-1"], [row (V,)], [(D,) | None], {"abc-1": 3}
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import torch

from .engine import FORK_OF, FORK_TOKENS, Context
from .load import import_vllm

__all__ = [
    "CAPTURED",
    "CAPTURED_HIDDEN",
    "CAPTURE_TAG",
    "CorePort",
    "captured_hidden",
    "captured_rows",
    "forget_captured",
    "install_hidden_capture",
    "processor_class",
]

CAPTURE_TAG = "llamppl_capture"  # key of SamplingParams.extra_args read by the capture processor

# Filled by the capture processor (in this process): tag -> (step tensor (k, V), row index).
# Each step's rows are ONE tensor; a tag's row is a view of it, overwritten by a later
# step (a request in chunked prefill is captured again when its prompt is complete).
CAPTURED: dict[str, tuple[torch.Tensor, int]] = {}
# The same for the rows' final hidden states (step tensor (k, D) float32), filled beside
# CAPTURED in the steps whose compute_logits is wrapped (install_hidden_capture).
CAPTURED_HIDDEN: dict[str, tuple[torch.Tensor, int]] = {}
_LOCK = threading.Lock()

# The rows given to the wrapped compute_logits of the running engine step, until the
# capture processor of that step takes them (vLLM samples a step before it runs the next).
_step_hidden: torch.Tensor | None = None
_WRAPPED = "_llamppl_keeps_hidden"  # attribute that marks our compute_logits wrapper


def _latest(
    store: dict[str, tuple[torch.Tensor, int]], tags: list[str]
) -> list[torch.Tensor | None]:
    with _LOCK:
        hits = [store.get(t) for t in tags]
    return [None if hit is None else hit[0][hit[1]] for hit in hits]


def captured_rows(tags: list[str]) -> list[torch.Tensor | None]:
    """The latest captured log-prob row of each tag (a view of its step's tensor), or None."""
    return _latest(CAPTURED, tags)


def captured_hidden(tags: list[str]) -> list[torch.Tensor | None]:
    """The hidden state ``(D,)`` float32 captured with each tag's latest log-prob row (a view
    of its step's tensor), or None (no hidden capture installed on the engine)."""
    return _latest(CAPTURED_HIDDEN, tags)


def forget_captured(tags: list[str]) -> None:
    """Drop the captured rows (log-probs and hidden states) of ``tags``."""
    with _LOCK:
        for t in tags:
            CAPTURED.pop(t, None)
            CAPTURED_HIDDEN.pop(t, None)


def _take_step_hidden(n_rows: int) -> torch.Tensor | None:
    """The hidden states the step's ``compute_logits`` was given, if they are its ``n_rows``
    logit rows (else None); the slot is emptied, so a later step never reads them."""
    global _step_hidden
    hidden, _step_hidden = _step_hidden, None
    return hidden if hidden is not None and hidden.shape[0] == n_rows else None


def install_hidden_capture(llm: Any) -> str | None:
    """Wrap the ``compute_logits`` of the engine's model (once per model) so that the capture
    processor stores each tagged row's hidden state too. Returns None when done, else why not.

    It runs through ``LLM.apply_model`` in the engine's worker, which must be this process
    (the processor's store is this process's); the wrapper only keeps a reference to its
    argument, so a step costs no copy beyond the processor's ``index_select`` of its rows.
    """
    apply_model = getattr(llm, "apply_model", None)
    if not callable(apply_model):
        return f"{type(llm).__name__} has no apply_model (vllm.LLM's) to reach the model"
    pid = os.getpid()

    def wrap(model: Any) -> str | None:
        if os.getpid() != pid:
            return "the vLLM engine runs in another process"
        compute_logits = getattr(model, "compute_logits", None)
        if not callable(compute_logits):
            return f"the model {type(model).__name__} has no compute_logits"
        if getattr(compute_logits, _WRAPPED, False):
            return None

        def keeping_hidden(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            global _step_hidden
            _step_hidden = hidden_states
            return compute_logits(hidden_states, *args, **kwargs)

        setattr(keeping_hidden, _WRAPPED, True)
        model.compute_logits = keeping_hidden  # an instance attribute: the runner's call
        return None

    try:
        reasons = apply_model(wrap)
    except Exception as exc:  # e.g. the function cannot be sent to an out-of-process engine
        return f"vLLM could not run a function on its model in this process ({exc})"
    return next((r for r in reasons if r is not None), None)


def processor_class() -> type:
    """The vLLM v1 logits processor class that captures tagged requests' log-probs (and their
    hidden states, on an engine with :func:`install_hidden_capture`)."""
    from vllm.v1.sample.logits_processor import LogitsProcessor, MoveDirectionality

    class CaptureLogprobs(LogitsProcessor):
        """Stores ``log_softmax`` of the rows of requests tagged ``extra_args[CAPTURE_TAG]``,
        and the rows' hidden states when the step's ``compute_logits`` kept them."""

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
                tag = (getattr(params, "extra_args", None) or {}).get(CAPTURE_TAG)
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
            hidden = _take_step_hidden(logits.shape[0])  # (B, D) or None
            rows = [i for i in self.tags if i < logits.shape[0]]
            if rows:
                idx = torch.tensor(rows, device=logits.device)  # host -> device, no sync
                logps = torch.log_softmax(logits.index_select(0, idx).float(), dim=-1)  # (k, V)
                states = None if hidden is None else hidden.index_select(0, idx).float()
                with _LOCK:
                    for k, i in enumerate(rows):
                        tag = self.tags[i]
                        CAPTURED[tag] = (logps, k)
                        if states is None:
                            CAPTURED_HIDDEN.pop(tag, None)  # never a stale step's
                        else:
                            CAPTURED_HIDDEN[tag] = (states, k)
            return logits

    return CaptureLogprobs


class CorePort:
    """Resumable one-token requests on vLLM's engine core (module docstring).

    Parameters
    ----------
    llm : vllm.LLM
        The engine; built with the fork connector (:func:`llamppl.lm.vllm.load.build_engine`)
        for forks to load their ancestor's K/V, otherwise forks recompute their tail.
    capture : str
        ``"processor"`` or ``"logprobs"``.
    vocab_size : int
        Width of the rows.
    tag_prefix : str
        Unique prefix of this port's capture tags.
    sampling_params : type | None
        The request-parameters class (default ``vllm.SamplingParams``).
    """

    def __init__(
        self,
        llm: Any,
        capture: str,
        vocab_size: int,
        tag_prefix: str,
        sampling_params: type | None = None,
    ) -> None:
        engine = llm.llm_engine
        self.core = engine.engine_core
        self.inputs = engine.input_processor
        self.tasks = engine.get_supported_tasks()
        self.capture = capture
        self.vocab_size = vocab_size
        self.tag_prefix = tag_prefix
        if sampling_params is None:
            sampling_params = import_vllm().SamplingParams
        self._params_cls = sampling_params
        self._chunk: dict[str, int] = {}  # request id -> tokens of its pending chunk
        self._length: dict[str, int] = {}  # request id -> its context's length
        self.max_len: int | None = getattr(engine.model_config, "max_model_len", None)
        self._new: set[str] = set()  # pending requests that are new (their cache hit counts)

    # ------------------------------------------------------------------ requests
    def _params(self, request_id: str, fork_of: str | None = None, fork_tokens: int = 0) -> Any:
        extra: dict[str, Any] = {CAPTURE_TAG: f"{self.tag_prefix}:{request_id}"}
        if fork_of is not None:
            extra["kv_transfer_params"] = {FORK_OF: fork_of, FORK_TOKENS: int(fork_tokens)}
        kw: dict[str, Any] = {"max_tokens": 1, "temperature": 0.0, "detokenize": False}
        if self.capture == "logprobs":
            kw["logprobs"] = -1
        return self._params_cls(**kw, ignore_eos=True, extra_args=extra)

    def _add(self, request_id: str, tokens: Context, params: Any) -> None:
        length = self._length.get(request_id, 0) + len(tokens)
        if self.max_len is not None and length >= self.max_len:
            raise ValueError(
                f"token_ids of length {length} do not fit the vLLM engine's max_model_len="
                f"{self.max_len} (a context needs one more position for its next token)"
            )
        prompt = {"type": "token", "prompt_token_ids": list(tokens)}  # vLLM's TokensInput
        request = self.inputs.process_inputs(request_id, prompt, params, self.tasks, resumable=True)
        request.external_req_id = request_id
        self.core.add_request(request)
        self._chunk[request_id] = len(tokens)
        self._length[request_id] = length

    def start(
        self, request_id: str, tokens: Context, fork_of: str | None, fork_tokens: int
    ) -> None:
        """Add a new resumable request for ``tokens`` (forked: see :mod:`llamppl.lm.vllm.fork`)."""
        self._add(request_id, tokens, self._params(request_id, fork_of, fork_tokens))
        self._new.add(request_id)

    def resume(self, request_id: str, new_tokens: Context) -> None:
        """Send ``new_tokens`` as the next input chunk of the live request ``request_id``."""
        self._add(request_id, new_tokens, self._params(request_id))

    def abort(self, request_ids: list[str]) -> None:
        """Abort ``request_ids`` (their blocks are freed; full blocks stay prefix-cached)."""
        self.core.abort_requests(list(request_ids))
        for rid in request_ids:
            self._chunk.pop(rid, None)
            self._length.pop(rid, None)
            self._new.discard(rid)
        forget_captured([f"{self.tag_prefix}:{rid}" for rid in request_ids])

    # ------------------------------------------------------------------ one step
    def step(
        self,
    ) -> tuple[list[str], list[torch.Tensor], list[torch.Tensor | None], dict[str, int]]:
        """One engine step: ids whose row is ready, their rows, their hidden states (None
        where not captured: ``capture="logprobs"`` or no :func:`install_hidden_capture`),
        tokens computed by id."""
        outputs = self.core.get_output().outputs
        done = [o for o in outputs if o.new_token_ids and o.request_id in self._chunk]
        ids = [o.request_id for o in done]
        computed: dict[str, int] = {}
        for o in done:
            n = self._chunk.pop(o.request_id)
            stats = getattr(o, "prefill_stats", None)
            if o.request_id in self._new and stats is not None:
                n = int(stats.num_computed_tokens)  # prompt minus cache hit and K/V loaded
            self._new.discard(o.request_id)
            computed[o.request_id] = n
        if not done:
            return [], [], [], computed
        if self.capture == "processor":
            tags = [f"{self.tag_prefix}:{rid}" for rid in ids]
            rows = captured_rows(tags)
            if any(r is None for r in rows):
                raise RuntimeError(
                    "the vLLM logits processor captured no log-probs: the engine does not run "
                    "in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, tensor_parallel_size=1) "
                    "or use capture='logprobs'"
                )
            return ids, rows, captured_hidden(tags), computed  # type: ignore[return-value]
        return ids, self._scatter([o.new_logprobs for o in done]), [None] * len(ids), computed

    def _scatter(self, logprobs: list[Any]) -> list[torch.Tensor]:
        """One ``(k, V)`` tensor from the outputs' full-vocabulary log-prob arrays."""
        if any(lp is None for lp in logprobs):
            raise RuntimeError("vLLM returned no logprobs; the engine needs max_logprobs=-1")
        ids = torch.from_numpy(np.stack([lp.logprob_token_ids[-1] for lp in logprobs]))
        vals = torch.from_numpy(np.stack([lp.logprobs[-1] for lp in logprobs]).astype(np.float32))
        rows = torch.full((len(logprobs), self.vocab_size), float("-inf"), dtype=torch.float32)
        rows.scatter_(1, ids.long(), vals)
        return list(rows)
