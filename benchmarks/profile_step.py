"""Where one SMC step's time goes, and how many host syncs it makes, on the embedded SmolLM2 (not a test).

Task: ``smc_standard`` on the LLaMPPL hard constraint ("The Fed says", no word longer
than 5 letters, token-masking proposal). After ``--warmup`` steps, the next ``--steps``
steps are measured with wall-clock timers wrapped around existing functions at run
time (no library code is edited). Time is *exclusive*: a wrapped call nested in
another counts only in its own category. Categories:

``plan``        LM Python: trie walk, grouping, row layout, index upload (the LM's batch entry)
``mask``        attention (tree) mask building, per layer
``forward``     the transformer body (``model.base_model.forward``) less the K/V pool
``kv_pool``     K/V pool writes and gathers inside the forward (``KVPool.write`` / ``read``)
``head``        the LM head product (``model.get_output_embeddings()``)
``logsoftmax``  log-softmax of the head's logits
``extract``     row extraction: hidden rows to nodes, log-prob rows to requests
``sampling``    token sampling (``llamppl.row_sampling.sample_index``; batched: ``serve_rows``,
                which also reads the round's mask masses and observed log-probs, and
                applies the pending masks)
``constraint``  the constraint's vectorised mask (``allowed_mask``), part of model code
``model``       the rest of the user's ``step`` and the DSL
``other``       the rest of the step's wall time: engine (weights, resampling, clones), asyncio

``--clock cpu`` times with this thread's CPU time instead of the wall clock (with one
torch thread all work runs in this thread, so the split stays honest on a loaded machine).

The second part counts host syncs per step (``.item()``, ``.tolist()``, ``.cpu()``,
``.numpy()``, ``int()``/``float()``/``bool()`` of a tensor) through a
``torch.overrides.TorchFunctionMode``, by category, at ``--sync-particles`` (default
N = 2, 8, 32), to show how they grow with N. On a CPU these are not real device
syncs; on a GPU each one waits for the device.

The LM hooks are looked up by name in :data:`TARGETS` (the LM class's methods, or
functions in the LM's module); if the LM layer is restructured and one cannot be
found, the script stops and names what it looked for::

    .venv/bin/python benchmarks/profile_step.py --particles 16 64 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _args import positive_int  # noqa: E402

CATEGORIES = (
    "plan",
    "mask",
    "forward",
    "kv_pool",
    "head",
    "logsoftmax",
    "extract",
    "sampling",
    "constraint",
    "model",
    "other",
)
# (what, category, phase of the caller after it returns, required, candidate names).
# "method:NAME" is looked up on the LM's class; "global:NAME" in the module of the LM's class
# (patched there, where the LM's code reads it).
TARGETS = [
    ("LM batch entry", "plan", None, True, ["method:_next_token_logprobs_batch"]),
    ("row layout", "plan", None, False, ["global:plan_rows"]),
    ("index upload", "plan", "mask", True, ["method:_upload"]),
    ("tree mask", "mask", None, False, ["global:tree_mask"]),
    ("per-layer masks", "mask", "plan", True, ["method:_layer_masks", "global:layer_masks"]),
    ("log-softmax", "logsoftmax", "extract", True, ["method:_logprobs_from_hidden"]),
]
POOL_METHODS = (
    "write",
    "read",
)  # of llamppl.lm.hf.kv_pool.KVPool (optional: reported as 0 if gone)
SYNC_NAMES = {"item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__"}


class Profiler:
    """Exclusive wall time per category over a stack of timed calls."""

    def __init__(self) -> None:
        self.stack: list[list] = []  # [category or phase, start time]
        self.acc: dict[str, float] = defaultdict(float)
        self.syncs: Counter = Counter()
        self.clock = time.perf_counter  # or time.thread_time (--clock cpu)

    def push(self, category: str) -> None:
        now = self.clock()
        if self.stack:
            top = self.stack[-1]
            self.acc[top[0]] += now - top[1]
        self.stack.append([category, now])

    def pop(self, caller_phase: str | None = None) -> None:
        now = self.clock()
        cat, start = self.stack.pop()
        self.acc[cat] += now - start
        if self.stack:
            self.stack[-1][1] = now
            if caller_phase is not None:
                self.stack[-1][0] = caller_phase

    def reset(self) -> None:
        now = self.clock()
        self.acc.clear()
        self.syncs.clear()
        for frame in self.stack:
            frame[1] = now

    def timed(self, fn, category: str, caller_phase: str | None = None):
        def wrapper(*args, **kwargs):
            self.push(category)
            try:
                return fn(*args, **kwargs)
            finally:
                self.pop(caller_phase)

        wrapper.__wrapped__ = fn
        return wrapper


PROF = Profiler()


class SyncCounter(TorchFunctionMode):
    """Counts tensor-to-host reads by name and by the profiler category they happen in."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in SYNC_NAMES:
            PROF.syncs[PROF.stack[-1][0] if PROF.stack else "other", name] += 1
        return func(*args, **(kwargs or {}))


class _Resumes:
    """Awaitable that drives a coroutine, timing each resume as ``model`` code."""

    def __init__(self, coro) -> None:
        self.coro = coro

    def __await__(self):
        value, error = None, None
        while True:
            PROF.push("model")
            try:
                out = self.coro.throw(error) if error is not None else self.coro.send(value)
            except StopIteration as stop:
                return stop.value
            finally:
                PROF.pop()
            try:
                value, error = (yield out), None
            except BaseException as exc:  # noqa: BLE001 (cancellation etc. go into the coroutine)
                value, error = None, exc


def install(lm, model_cls) -> list:
    """Wrap the LM, sampling and model hooks; returns undo actions. Exits naming what is missing."""
    import llamppl.row_sampling as token_module

    undo = []
    cls, module = type(lm), sys.modules[type(lm).__module__]
    for what, category, phase, required, names in TARGETS:
        found = False
        for name in names:
            kind, attr = name.split(":")
            if kind == "method":
                owner = next((k for k in cls.__mro__ if attr in vars(k)), None)
                if owner is None:
                    continue
                original = vars(owner)[attr]
                setattr(owner, attr, PROF.timed(original, category, phase))
                undo.append(lambda o=owner, a=attr, f=original: setattr(o, a, f))
            else:
                if not callable(getattr(module, attr, None)):
                    continue
                original = getattr(module, attr)
                setattr(module, attr, PROF.timed(original, category, phase))
                undo.append(lambda m=module, a=attr, f=original: setattr(m, a, f))
            found = True
            break
        if required and not found:
            raise SystemExit(
                f"profile_step.py: could not find the {what} ({' or '.join(names)}) on "
                f"{cls.__qualname__} / module {module.__name__}; update TARGETS in {__file__}"
            )
    base = getattr(lm.model, "base_model", None)
    head = lm.model.get_output_embeddings() if hasattr(lm.model, "get_output_embeddings") else None
    if base is None or head is None:
        raise SystemExit("profile_step.py: lm.model needs base_model and get_output_embeddings()")
    for mod, category, phase in ((base, "forward", "extract"), (head, "head", None)):
        mod.forward = PROF.timed(mod.forward, category, phase)
        undo.append(lambda m=mod: delattr(m, "forward"))
    try:
        from llamppl.lm.hf.kv_pool import KVPool
    except ImportError:
        print("profile_step.py: no llamppl.lm.hf.kv_pool.KVPool; kv_pool stays inside forward")
    else:
        for name in POOL_METHODS:
            original = vars(KVPool)[name]
            setattr(KVPool, name, PROF.timed(original, "kv_pool"))
            undo.append(lambda n=name, f=original: setattr(KVPool, n, f))
    patched = [
        m
        for name, m in list(sys.modules.items())
        if name.startswith("llamppl")
        and getattr(m, "sample_index", None) is token_module.sample_index
    ]
    if len(patched) < 2:  # llamppl.row_sampling itself and at least the module LMContext samples in
        raise SystemExit(
            "profile_step.py: no module besides llamppl.row_sampling uses sample_index"
        )
    original = token_module.sample_index
    for m in patched:
        m.sample_index = PROF.timed(original, "sampling")
        undo.append(lambda m=m: setattr(m, "sample_index", original))
    serve = getattr(token_module, "serve_rows", None)  # batched row reads (samples, masses)
    if serve is not None:  # looked up when each event loop's Coalescer is made
        token_module.serve_rows = PROF.timed(serve, "sampling")
        undo.append(lambda: setattr(token_module, "serve_rows", serve))
    return undo


def profiled_model_class():
    from llamppl.models import HardConstraint

    class ProfiledHardConstraint(HardConstraint):
        """``HardConstraint`` whose step resumes are timed; the window opens at step ``window_start`` + 1.

        ``window`` receives (time, forward calls, tokens run) when the window opens.
        """

        window_start = 0
        window: list[tuple[float, int, int]] = []

        async def step(self):
            if len(self.context.generated) == self.window_start and not self.window:
                PROF.reset()
                stats = self.context.lm.stats
                self.window.append((PROF.clock(), stats.forward_calls, stats.tokens_run))
            return await _Resumes(super().step())

    return ProfiledHardConstraint


def measure(lm, cls, n: int, warmup: int, steps: int, seed: int, count_syncs: bool) -> dict:
    """One run; per-step ms by category over the window, plus forwards, rows and syncs."""
    from llamppl import run
    from llamppl.inference import smc_standard
    from llamppl.models import max_word_length

    constraint = max_word_length(5)
    constraint.allowed_mask = PROF.timed(constraint.allowed_mask, "constraint")
    lm.clear_cache()
    cls.window_start, cls.window = warmup, []
    model = cls(lm, "The Fed says", constraint, "mask", max_tokens=warmup + steps)
    if count_syncs:
        with SyncCounter():
            run(smc_standard(model, n, seed=seed, progress=False))
    else:
        run(smc_standard(model, n, seed=seed, progress=False))
    if not cls.window:
        raise RuntimeError("every particle stopped before the measured window; lower --warmup")
    t0, fwd0, tok0 = cls.window[0]
    wall = PROF.clock() - t0
    acc = dict(PROF.acc)
    acc["other"] = wall - sum(acc.values())
    fwd = lm.stats.forward_calls - fwd0
    return {
        "ms": {c: 1e3 * acc.get(c, 0.0) / steps for c in CATEGORIES},
        "step_ms": 1e3 * wall / steps,
        "rows": (lm.stats.tokens_run - tok0) / max(fwd, 1),
        "forwards": fwd,
        "syncs": Counter({k: v / steps for k, v in PROF.syncs.items()}),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--particles", type=positive_int, nargs="+", default=[16, 64])
    ap.add_argument("--sync-particles", type=positive_int, nargs="+", default=[2, 8, 32])
    ap.add_argument("--warmup", type=positive_int, default=3, help="steps before the window")
    ap.add_argument("--steps", type=positive_int, default=8, help="steps measured")
    ap.add_argument("--repeats", type=positive_int, default=3, help="runs per N (median)")
    ap.add_argument("--threads", type=positive_int, default=1, help="torch.set_num_threads")
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall clock, or this thread's CPU time (robust to other load with one thread)",
    )
    args = ap.parse_args()
    PROF.clock = time.perf_counter if args.clock == "wall" else time.thread_time

    from llamppl import CachedCausalLM

    torch.set_num_threads(args.threads)
    lm = CachedCausalLM.default()
    cls = profiled_model_class()
    undo = install(lm, cls)
    try:
        measure(lm, cls, 4, 1, 2, 0, False)  # warm-up: word tables, first forwards
        print(
            f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); smc_standard, hard "
            f"constraint; steps {args.warmup + 1}..{args.warmup + args.steps}; median of "
            f"{args.repeats} runs (seeds 0..{args.repeats - 1}); ms per step ({args.clock} clock), exclusive"
        )
        results = {}
        for n in args.particles:
            runs = [
                measure(lm, cls, n, args.warmup, args.steps, s, False) for s in range(args.repeats)
            ]
            results[n] = {
                "ms": {c: statistics.median(r["ms"][c] for r in runs) for c in CATEGORIES},
                "step_ms": statistics.median(r["step_ms"] for r in runs),
                "rows": statistics.median(r["rows"] for r in runs),
            }
        cols = "".join(f"{f'N={n} ms':>12}{'%':>7}" for n in results)
        print(f"{'category':<12}{cols}")
        for c in CATEGORIES:
            cells = "".join(
                f"{r['ms'][c]:>12.2f}{100 * r['ms'][c] / r['step_ms']:>6.1f}%"
                for r in results.values()
            )
            print(f"{c:<12}{cells}")
        print(
            f"{'step':<12}"
            + "".join(f"{r['step_ms']:>12.2f}{100:>6.1f}%" for r in results.values())
        )
        print(f"{'rows/fwd':<12}" + "".join(f"{r['rows']:>12.1f}{'':>7}" for r in results.values()))

        print("\nhost syncs per step (TorchFunctionMode; one run each, seed 0)")
        counts = {
            n: measure(lm, cls, n, args.warmup, args.steps, 0, True) for n in args.sync_particles
        }
        keys = sorted(set().union(*(r["syncs"] for r in counts.values())))
        print(f"{'category':<12}{'call':<12}" + "".join(f"{f'N={n}':>9}" for n in counts))
        for key in keys:
            print(
                f"{key[0]:<12}{key[1]:<12}"
                + "".join(f"{r['syncs'][key]:>9.1f}" for r in counts.values())
            )
        totals = "".join(f"{sum(r['syncs'].values()):>9.1f}" for r in counts.values())
        print(f"{'total':<24}{totals}")
        print(
            f"{'per particle':<24}"
            + "".join(f"{sum(r['syncs'].values()) / n:>9.2f}" for n, r in counts.items())
        )
    finally:
        for action in reversed(undo):
            action()


if __name__ == "__main__":
    main()
