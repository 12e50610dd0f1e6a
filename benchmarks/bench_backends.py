"""LM backends and Ray fan-out on the quickstart task (not a test).

(lm)  The quickstart task (examples/quickstart.py: "The Fed says", no word longer than
      five letters, 30 tokens, ``smc_steer`` N=16, K=3, seed 0) through ``CachedCausalLM``
      and through ``VLLMLM`` (one engine; both capture modes, each with one-token requests
      per round and with ``live=True``, particles as live requests) in ONE process: wall
      time, engine calls (forwards / ``generate`` calls / engine steps) and tokens
      computed, with ratios to the trie.
      Needs vLLM: run it from ``.venv-vllm`` (``bash scripts/setup-vllm.sh``).
(ray) ``run_many`` throughput (jobs/minute, worker start-up included) for 1 vs 2 Ray
      workers on the embedded model: ``--jobs`` jobs of ``smc_standard`` on the quickstart
      model (N=8, 12 tokens), and the mean time of one job inside its worker (it grows when
      the workers compete for cores). Needs Ray: run it from ``.venv``.

::

    .venv-vllm/bin/python benchmarks/bench_backends.py --part lm
    .venv-vllm/bin/python benchmarks/bench_backends.py --part lm --model /models/Qwen2.5-7B-Instruct
    .venv/bin/python benchmarks/bench_backends.py --part ray

(``--model``: a local model on one GPU, both backends in bfloat16, vLLM given half the
GPU memory; see docs/scaling/gpu_server.md.)

Threads: torch gets ``--threads`` (default 1); vLLM's CPU backend pins its own OpenMP
threads, so ``VLLM_CPU_OMP_THREADS_BIND`` is set to the same number of cores.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))


def bench_lm(args: argparse.Namespace) -> None:
    import torch
    from quickstart import NoLongWords

    from llamppl import CachedCausalLM, run
    from llamppl.inference import smc_steer
    from llamppl.lm.hf.embedded import converted_dir
    from llamppl.lm.vllm.lm import VLLMLM

    def quickstart(lm) -> tuple[float, dict]:
        model = NoLongWords(lm, "The Fed says", 5, args.max_tokens)
        t0 = time.perf_counter()
        result = run(smc_steer(model, args.particles, args.beam, seed=0, progress=False))
        return time.perf_counter() - t0, result.stats

    if args.model is None:  # the embedded SmolLM2-135M, fp32, on the CPU
        hf = CachedCausalLM.default()
        path, dtype = converted_dir(), "float32"
    else:  # a local model directory on args.device (e.g. a 7B model on one GPU)
        path, dtype = args.model, args.dtype
        hf = CachedCausalLM.from_pretrained(path, args.device, dtype=getattr(torch, dtype))
    t0 = time.perf_counter()
    engine_kw = {"gpu_memory_utilization": args.gpu_memory_utilization}
    vlm = VLLMLM.from_pretrained(path, dtype=dtype, max_model_len=512, **engine_kw)
    start = time.perf_counter() - t0
    backends = [
        ("CachedCausalLM (token trie)", lambda: CachedCausalLM(hf.model, hf.tokenizer)),
        ("VLLMLM live=True, processor", lambda: VLLMLM(vlm.llm, "processor", live=True)),
        ("VLLMLM live=True, logprobs", lambda: VLLMLM(vlm.llm, "logprobs", live=True)),
        ("VLLMLM live=False, processor", lambda: VLLMLM(vlm.llm, "processor", live=False)),
        ("VLLMLM live=False, logprobs", lambda: VLLMLM(vlm.llm, "logprobs", live=False)),
    ]
    warm = VLLMLM(vlm.llm, capture="processor", live=True)
    quickstart(warm)  # warm-up (first-call kernels), not timed
    warm.release()
    print(
        f"quickstart smc_steer N={args.particles} K={args.beam}, {args.max_tokens} tokens; "
        f"torch threads {torch.get_num_threads()}, vLLM start-up {start:.1f} s"
    )
    print(
        f"{'backend':32} {'wall s':>8} {'engine calls':>13} {'tokens':>8} "
        f"{'wall/trie':>10} {'tokens/trie':>12}"
    )
    base = None
    for name, make in backends:
        lm = make()
        lm.clear_cache()
        wall, stats = quickstart(lm)
        if hasattr(lm, "release"):
            lm.release()  # free the last round's live requests before the next row
        base = base or (wall, stats["tokens_run"])
        print(
            f"{name:32} {wall:8.2f} {stats['forward_calls']:13d} {stats['tokens_run']:8d} "
            f"{wall / base[0]:10.2f} {stats['tokens_run'] / base[1]:12.2f}"
        )


def bench_ray(args: argparse.Namespace) -> None:
    import quickstart
    import ray
    import torch

    from llamppl import CachedCausalLM
    from llamppl.distributed import jobs_grid, run_many

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(quickstart)
    make = functools.partial(quickstart.NoLongWords, max_letters=5, max_tokens=12)
    jobs = jobs_grid(make, ["The Fed says"], seeds=range(args.jobs), n_particles=8)
    print(
        f"run_many: {len(jobs)} jobs of smc_standard N=8, 12 tokens; "
        f"torch threads per worker 1 (driver {torch.get_num_threads()})"
    )
    print(f"{'workers':>8} {'wall s':>8} {'jobs/min':>9} {'speedup':>8} {'mean job s':>11}")
    base = None
    for n in (1, 2):
        t0 = time.perf_counter()
        results = run_many(jobs, CachedCausalLM.default, n_workers=n, progress=False)
        wall = time.perf_counter() - t0
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        base = base or wall
        job_s = sum(r.time_s for r in results) / len(results)  # inside the worker
        print(f"{n:8d} {wall:8.2f} {60 * len(jobs) / wall:9.1f} {base / wall:8.2f} {job_s:11.2f}")
    ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["lm", "ray", "all"], default="all")
    parser.add_argument("--particles", type=int, default=16)
    parser.add_argument("--beam", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--model", default=None, help="local model directory (default: the embedded SmolLM2)"
    )
    parser.add_argument("--device", default="cuda", help="CachedCausalLM's device with --model")
    parser.add_argument("--dtype", default="bfloat16", help="both backends' dtype with --model")
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.5,
        help="vLLM's share of the GPU (the trie's model shares it)",
    )
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    for part, needs, fn in (("lm", "vllm", bench_lm), ("ray", "ray", bench_ray)):
        if args.part in (part, "all"):
            if importlib.util.find_spec(needs) is None:
                print(f"[{part}] skipped: {needs} is not installed in this environment")
            else:
                fn(args)


if __name__ == "__main__":
    main()
