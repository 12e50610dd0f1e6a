"""Particles as live vLLM requests: each SMC round extends them instead of recomputing.

With ``VLLMLM(llm, live=True)`` every context the particles ask for is held by a
*lane*: a resumable request of vLLM's v1 engine (a streaming-input session) whose
K/V for the whole context is computed and kept by the engine between rounds. One
round of requests (the contexts awaited concurrently, e.g. one SMC step) is
planned by :func:`plan_round` against the live lanes:

``row``
    the context IS a lane's context: its row is already here, no engine work;
``extend``
    a lane's context is a prefix of it: the lane receives the new token(s) as its
    next input chunk and computes only them (one token per particle per step);
``fork``
    that lane was already claimed by another context this round (a resampled
    particle with several children): a new request starts from the lane's K/V —
    vLLM's prefix cache shares the full blocks and the engine copies the partial
    last block (:mod:`llamppl.lm.vllm.fork`), so again only the new token is run;
``new``
    no lane is a prefix: a new request (the prefix cache still serves full blocks).

Lanes nobody asked for in a round belong to particles that died, finished or were
not resampled; they are aborted at the end of the round, which frees their
blocks at once (full blocks stay in vLLM's prefix cache until evicted)::

    sessions = LiveSessions(port, prefix="lm1")  # port: an engine adapter, see EnginePort
    rows = sessions.run([(1, 2, 3), (1, 2, 4)])  # one (V,) row per context
    sessions.stats                               # VLLMStats: engine steps, tokens, forks, ...

The engine adapter is :class:`EnginePort` (vLLM's engine core, in
:mod:`llamppl.lm.vllm.port`); this module imports no vLLM and is tested against a fake engine core.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..base import LMStats

__all__ = [
    "FORK_OF",
    "FORK_TOKENS",
    "EnginePort",
    "Lane",
    "LiveSessions",
    "RoundPlan",
    "VLLMStats",
    "fork_block_copies",
    "plan_round",
    "split_wave",
]

# Keys of ``SamplingParams.extra_args["kv_transfer_params"]`` read by the fork connector.
FORK_OF = "llamppl_fork_of"
FORK_TOKENS = "llamppl_fork_tokens"

Context = tuple[int, ...]


def fork_block_copies(
    src: Sequence[int], dst: Sequence[int], start: int, end: int, block_size: int
) -> list[tuple[int, int]]:
    """``(src_block, dst_block)`` pairs that carry token positions ``[start, end)`` over.

    ``src`` and ``dst`` are the block tables (block ids by position // ``block_size``) of
    the ancestor and the forked request; ``start`` is block-aligned (the end of the
    prefix-cache hit, whose blocks the two already share). Block 0 is vLLM's null block
    (never holds K/V) and is skipped, as are blocks the two share.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size}")
    if start % block_size:
        raise ValueError(f"start must be a multiple of block_size={block_size}, got {start}")
    last = min(-(-end // block_size), len(src), len(dst))
    return [
        (src[i], dst[i])
        for i in range(start // block_size, last)
        if src[i] != dst[i] and src[i] != 0 and dst[i] != 0
    ]


@dataclass(eq=False)
class Lane:
    """One live engine request: its id, the context whose K/V it holds, its latest row and
    that row's hidden state (None if the engine does not capture it)."""

    request_id: str
    tokens: Context
    row: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    idle: int = 0  # rounds in a row in which nobody asked for this lane


@dataclass
class RoundPlan:
    """What one round asks of the engine (see the module docstring)."""

    rows: dict[Context, Lane] = field(default_factory=dict)
    extend: list[tuple[Context, Lane]] = field(default_factory=list)
    fork: list[tuple[Context, Lane]] = field(default_factory=list)
    new: list[Context] = field(default_factory=list)
    unused: list[Lane] = field(default_factory=list)


def _ancestor(c: Context, lanes: dict[Context, Lane], lengths: list[int]) -> Lane | None:
    """The lane with the longest context that is a proper prefix of ``c`` (or None)."""
    parent = lanes.get(c[:-1])
    if parent is not None:
        return parent
    for m in lengths:  # distinct lane lengths, longest first
        if m < len(c) - 1:
            lane = lanes.get(c[:m])
            if lane is not None:
                return lane
    return None


def plan_round(
    contexts: Sequence[Context], lanes: dict[Context, Lane], claimed: frozenset[int] = frozenset()
) -> RoundPlan:
    """Assign each distinct context to a row, an extension, a fork or a new request.

    A lane is extended by at most one context (the first that asks) and never when
    its own context is asked for (or it is in ``claimed``: ids of lanes that serve a
    context of this round already); other descendants fork from it. Lanes that
    serve nothing are ``unused``.
    """
    plan = RoundPlan()
    used: set[int] = set(claimed)
    lengths = sorted({len(t) for t in lanes}, reverse=True)
    for c in contexts:
        lane = lanes.get(c)
        if lane is not None:
            plan.rows[c] = lane
            used.add(id(lane))
    for c in contexts:
        if c in plan.rows:
            continue
        lane = _ancestor(c, lanes, lengths)
        if lane is None:
            plan.new.append(c)
        elif id(lane) in used:
            plan.fork.append((c, lane))
        else:
            plan.extend.append((c, lane))
            used.add(id(lane))
    plan.unused = [lane for lane in lanes.values() if id(lane) not in used]
    return plan


def split_wave(contexts: Sequence[Context]) -> tuple[list[Context], list[Context]]:
    """``(wave, rest)``: the contexts none of whose proper prefixes is among ``contexts``, and the others.

    A context asked for together with one of its prefixes (a program that takes
    several tokens at once) is served in a later wave, from the prefix's request.
    """
    asked = set(contexts)
    lengths = sorted({len(c) for c in contexts})
    wave, rest = [], []
    for c in contexts:
        nested = any(c[:m] in asked for m in lengths if m < len(c))
        (rest if nested else wave).append(c)
    return wave, rest


class EnginePort(Protocol):
    """What :class:`LiveSessions` needs from an engine (vLLM's: :class:`~llamppl.lm.vllm.port.CorePort`)."""

    def start(
        self, request_id: str, tokens: Context, fork_of: str | None, fork_tokens: int
    ) -> None:
        """Add a resumable request for ``tokens`` (forked from ``fork_of``'s first ``fork_tokens``)."""

    def resume(self, request_id: str, new_tokens: Context) -> None:
        """Give the live request ``request_id`` its next input chunk."""

    def step(
        self,
    ) -> tuple[list[str], list[torch.Tensor], list[torch.Tensor | None], dict[str, int]]:
        """Run one engine step: ``(request ids whose row is ready, their rows (V,), their hidden
        states (D,) or None, tokens computed by id)``."""

    def abort(self, request_ids: list[str]) -> None:
        """Finish these requests and free their blocks."""


@dataclass
class VLLMStats(LMStats):
    """Work counters of a :class:`~llamppl.lm.vllm.lm.VLLMLM`, in vLLM's words and :class:`~llamppl.lm.base.LMStats`'.

    Attributes
    ----------
    forward_calls : int
        Engine calls: ``LLM.generate`` calls (one per coalesced batch), or engine steps
        with ``live=True``; alias ``engine_calls``.
    requests : int
        Requests sent to the engine (with ``live=True``: new and forked ones).
    tokens_run : int
        Tokens the engine computed: prompt tokens minus those its prefix cache served
        (and, with ``live=True``, minus those a fork loaded from its ancestor);
        alias ``tokens_computed``.
    prefix_cached_tokens : int
        Prompt tokens served by the engine's prefix cache (``live=False``).
    cache_hits : int
        Contexts served with no engine work (a memoised row; with ``live=True`` a live
        request's latest row).
    extends, forks, freed : int
        ``live=True``: live requests extended by their next tokens, requests forked from a
        live ancestor, live requests freed (their particle asked for nothing in a round).
    """

    prefix_cached_tokens: int = 0
    extends: int = 0
    forks: int = 0
    freed: int = 0

    @property
    def engine_calls(self) -> int:
        """Engine calls (``forward_calls``)."""
        return self.forward_calls

    @property
    def tokens_computed(self) -> int:
        """Tokens the engine ran (``tokens_run``)."""
        return self.tokens_run

    def __repr__(self) -> str:
        return (
            f"VLLMStats(engine_calls={self.engine_calls}, requests={self.requests}, "
            f"tokens_computed={self.tokens_computed}, "
            f"prefix_cached_tokens={self.prefix_cached_tokens}, cache_hits={self.cache_hits}, "
            f"extends={self.extends}, forks={self.forks}, freed={self.freed})"
        )


class LiveSessions:
    """The live lanes of one LM and the rounds that move them (module docstring).

    Parameters
    ----------
    port : EnginePort
        The engine adapter.
    prefix : str
        Prefix of this object's request ids (unique per LM).
    stats : VLLMStats | None
        Where the work is counted (default: a new one).
    idle_rounds : int
        Rounds a lane may go unasked before it is freed. ``0`` (default): freed at the
        end of the first round in which its particle asks for nothing (dead, finished
        or not resampled). A program whose live particles may skip a round (e.g.
        ``GrammarConstraint`` taking forced tokens without a forward) keeps their
        requests with ``1``, at the cost of holding a dead particle's one round longer.
    max_idle_steps : int
        Engine steps in a row that may bring no row before a round is declared
        stuck (the engine cannot admit the requests: K/V cache too small).
    """

    def __init__(
        self,
        port: EnginePort,
        prefix: str,
        stats: VLLMStats | None = None,
        idle_rounds: int = 0,
        max_idle_steps: int = 1000,
    ) -> None:
        self.port = port
        self.idle_rounds = idle_rounds
        self.prefix = prefix
        self.max_idle_steps = max_idle_steps
        self.lanes: dict[Context, Lane] = {}
        self.stats = VLLMStats() if stats is None else stats
        self._count = 0

    def _new_id(self) -> str:
        self._count += 1
        return f"{self.prefix}-{self._count}"

    def run(self, contexts: Sequence[Context], free_unused: bool = True) -> list[torch.Tensor]:
        """Rows ``(V,)`` of the distinct ``contexts``, in order (one round).

        Usually one wave (one engine step); contexts nested in others of the round
        wait for their prefix's request and fork from it (:func:`split_wave`).
        ``free_unused=False`` (a lone blocking call amid a run) frees no lane.
        """
        rows: dict[Context, torch.Tensor] = {}
        serving: set[int] = set()  # ids of the lanes that serve a context of this round
        todo = list(contexts)
        pending: dict[str, tuple[Lane, Context]] = {}
        try:
            while todo:
                wave, todo = split_wave(todo)
                plan = plan_round(wave, self.lanes, frozenset(serving))
                moved = [lane.tokens for _, lane in plan.extend]  # their keys change
                pending = self._submit(plan)
                self._step_until_done(pending)
                lanes = list(plan.rows.values()) + [lane for lane, _ in pending.values()]
                for key in moved:
                    del self.lanes[key]
                for lane in lanes:
                    self.lanes[lane.tokens] = lane
                    rows[lane.tokens] = lane.row  # type: ignore[assignment]
                    serving.add(id(lane))
                    lane.idle = 0
                self._count_plan(plan)
        except BaseException:
            # the engine's state is unknown: free everything, start afresh next round
            live = {lane.request_id for lane in self.lanes.values()}
            self.port.abort([rid for rid in pending if rid not in live])
            self.release()
            raise
        if not free_unused:
            return [rows[c] for c in contexts]
        unused = [lane for lane in self.lanes.values() if id(lane) not in serving]
        for lane in unused:
            lane.idle += 1
        free = [lane for lane in unused if lane.idle > self.idle_rounds]
        if free:
            self.port.abort([lane.request_id for lane in free])
            self.stats.freed += len(free)
            for lane in free:
                del self.lanes[lane.tokens]
        return [rows[c] for c in contexts]

    def _submit(self, plan: RoundPlan) -> dict[str, tuple[Lane, Context]]:
        """Send a plan's extensions, forks and new requests; ``{request id: (lane, context)}``."""
        pending: dict[str, tuple[Lane, Context]] = {}
        for c, lane in plan.extend:
            self.port.resume(lane.request_id, c[len(lane.tokens) :])
            pending[lane.request_id] = (lane, c)
        for c, parent in plan.fork:
            lane = Lane(self._new_id(), ())
            self.port.start(lane.request_id, c, parent.request_id, len(parent.tokens))
            pending[lane.request_id] = (lane, c)
        for c in plan.new:
            lane = Lane(self._new_id(), ())
            self.port.start(lane.request_id, c, None, 0)
            pending[lane.request_id] = (lane, c)
        return pending

    def _count_plan(self, plan: RoundPlan) -> None:
        st = self.stats
        st.extends += len(plan.extend)
        st.forks += len(plan.fork)
        st.requests += len(plan.fork) + len(plan.new)
        st.cache_hits += len(plan.rows)

    def _step_until_done(self, pending: dict[str, tuple[Lane, Context]]) -> None:
        waiting = dict(pending)
        idle = 0
        while waiting:
            ids, rows, hidden, computed = self.port.step()
            self.stats.forward_calls += 1
            self.stats.tokens_run += sum(computed.values())
            ready = [(k, rid) for k, rid in enumerate(ids) if rid in waiting]
            if not ready:
                idle += 1
                if idle >= self.max_idle_steps:
                    raise RuntimeError(
                        f"the vLLM engine made no progress on {len(waiting)} live requests in "
                        f"{idle} steps: its K/V cache is too small for this many particles "
                        "(raise gpu_memory_utilization or VLLM_CPU_KVCACHE_SPACE), or they "
                        f"exceed its max_num_seqs ({len(self.lanes) + len(waiting)} live "
                        "requests at most; every live particle holds one)"
                    )
                continue
            idle = 0
            for k, rid in ready:
                lane, c = waiting.pop(rid)
                # views of the step's (k, V) and (k, D) tensors
                lane.tokens, lane.row, lane.hidden = c, rows[k], hidden[k]

    def release(self) -> None:
        """Abort every live request (their blocks are freed) and forget the lanes."""
        ids = [lane.request_id for lane in self.lanes.values()]
        self.lanes = {}
        if ids:
            self.port.abort(ids)
            self.stats.freed += len(ids)
