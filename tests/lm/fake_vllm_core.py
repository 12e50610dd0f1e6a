"""A fake of vLLM's v1 engine core with resumable requests, for ``VLLMLM(live=True)`` without vLLM.

It serves a ``logits_fn`` (a :class:`FunctionLM`'s) the way vLLM 0.32 serves a model
to :class:`llamppl.lm.vllm.port.CorePort`:

- ``llm_engine.input_processor.process_inputs(id, {"type": "token", ...}, params, tasks,
  resumable=True)`` makes a request; ``llm_engine.engine_core.add_request`` starts it or,
  for an id that is waiting, appends it as the next input chunk (vLLM drops the
  throw-away token sampled after the previous chunk);
- ``get_output()`` is one engine step: it runs at most ``budget`` tokens (chunked
  prefill: a request whose tokens do not fit finishes in a later step), samples the
  greedy token and returns the full-vocabulary log-probs as numpy arrays (or stores
  the step's rows as ONE tensor in ``vllm_port.CAPTURED``, like the capture processor);
- a new request reuses whole ``BLOCK``-token blocks computed before (prefix cache,
  never the last token) and, when forked (``kv_transfer_params``), loads the rest of
  its ancestor's first ``n`` tokens while the ancestor lives (the fork connector);
- ``abort_requests`` frees a request.

The work is counted in ``computed`` (tokens run) and ``steps``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch

from llamppl.lm.vllm import port as vllm_port
from llamppl.lm.vllm.engine import FORK_OF, FORK_TOKENS

BLOCK = 4


def _log_softmax(logits: list[float]) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    return (x - np.logaddexp.reduce(x)).astype(np.float32)


@dataclass
class Params:  # the fields of vllm.SamplingParams that CorePort sets
    max_tokens: int = 16
    temperature: float = 1.0
    detokenize: bool = True
    ignore_eos: bool = False
    logprobs: int | None = None
    extra_args: dict = field(default_factory=dict)


class FakeInputProcessor:
    def process_inputs(self, request_id, prompt, params, supported_tasks, resumable=False):
        assert prompt["type"] == "token" and resumable is True
        assert params.max_tokens == 1 and params.temperature == 0.0
        return SimpleNamespace(
            request_id=request_id,
            prompt_token_ids=list(prompt["prompt_token_ids"]),
            params=params,
            kv_transfer_params=(params.extra_args or {}).get("kv_transfer_params"),
            external_req_id=None,
        )


class FakeCore:
    """The engine core: sessions, a block prefix cache, forks, budgeted steps."""

    def __init__(self, logits_fn: Callable, vocab_size: int, capture: str) -> None:
        self.logits_fn, self.vocab_size, self.capture = logits_fn, vocab_size, capture
        self.sessions: dict[str, dict] = {}  # id -> {"done": computed tokens, "todo": pending}
        self.blocks: set[tuple[int, ...]] = set()
        self.budget: int | None = None  # tokens per step (None: all)
        self.stall = False  # True: schedule nothing (a K/V cache that is full)
        self.steps = 0
        self.computed = 0
        self.loaded = 0  # tokens forks loaded from their ancestor
        self.aborted: list[str] = []

    def add_request(self, request) -> None:
        rid, toks = request.request_id, tuple(request.prompt_token_ids)
        s = self.sessions.get(rid)
        if s is not None:  # next input chunk of a waiting session
            assert not s["todo"], "a chunk was added before the previous one ran"
            s["todo"], s["params"] = toks, request.params
            return
        hit = 0  # prefix cache: whole blocks, never the last token
        while hit + BLOCK <= len(toks) - 1 and toks[: hit + BLOCK] in self.blocks:
            hit += BLOCK
        fork = request.kv_transfer_params or {}
        parent = self.sessions.get(fork.get(FORK_OF))
        n = min(int(fork.get(FORK_TOKENS, 0)), len(toks) - 1)
        if parent is not None and n > hit and parent["done"][:n] == toks[:n]:
            self.loaded += n - hit
            hit = n
        self.sessions[rid] = {
            "done": toks[:hit],
            "todo": toks[hit:],
            "params": request.params,
            "new": True,
        }

    def abort_requests(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            assert rid in self.sessions, f"abort of an unknown request {rid}"
            del self.sessions[rid]
            self.aborted.append(rid)

    def get_output(self):
        self.steps += 1
        budget = 0 if self.stall else (self.budget or 1 << 30)
        outs, rows, tags = [], [], []
        for rid, s in self.sessions.items():
            if not s["todo"] or budget <= 0:
                continue
            take = s["todo"][:budget]
            budget -= len(take)
            self.computed += len(take)
            s["done"], s["todo"] = s["done"] + take, s["todo"][len(take) :]
            done = s["done"]
            self.blocks |= {done[:k] for k in range(BLOCK, len(done) + 1, BLOCK)}
            if s["todo"]:
                outs.append(SimpleNamespace(request_id=rid, new_token_ids=[]))
                continue
            logps = _log_softmax(self.logits_fn(done))
            order = np.argsort(-logps, kind="stable")
            sampled = int(order[0])
            stats = SimpleNamespace(num_computed_tokens=len(take)) if s.pop("new", 0) else None
            out = SimpleNamespace(request_id=rid, new_token_ids=[sampled], prefill_stats=stats)
            if self.capture == "logprobs":  # vLLM: the sampled token first, then every rank
                ids = np.concatenate([[sampled], order])[None, :]
                vals = np.concatenate([[logps[sampled]], logps[order]])[None, :]
                out.new_logprobs = SimpleNamespace(logprob_token_ids=ids, logprobs=vals)
            else:
                tags.append(s["params"].extra_args[vllm_port.CAPTURE_TAG])
                rows.append(logps)
            outs.append(out)
        if rows:  # the capture processor: one (k, V) tensor per step
            step = torch.from_numpy(np.stack(rows))
            with vllm_port._LOCK:
                for k, tag in enumerate(tags):
                    vllm_port.CAPTURED[tag] = (step, k)
        return SimpleNamespace(outputs=outs)


class FakeLLM:
    """What ``VLLMLM(llm, live=True)`` reads from ``vllm.LLM``."""

    def __init__(self, logits_fn: Callable, vocab_size: int, tokenizer, capture: str) -> None:
        self.core = FakeCore(logits_fn, vocab_size, capture)
        self.tokenizer = tokenizer
        self.llm_engine = SimpleNamespace(
            model_config=SimpleNamespace(
                get_vocab_size=lambda: vocab_size, hf_config=None, max_model_len=64
            ),
            engine_core=self.core,
            input_processor=FakeInputProcessor(),
            get_supported_tasks=lambda: ("generate",),
        )

    def generate(self, *args, **kwargs):
        raise AssertionError("live mode must not call LLM.generate")

    def get_tokenizer(self):
        return self.tokenizer
