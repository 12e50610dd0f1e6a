"""The forward's promises on the AVX2 kernels, wherever the suite runs.

An AVX-512 CPU runs FBGEMM's, ATen's and MKL's AVX-512 code; an AVX2-only CPU (an AMD EPYC,
say) runs their AVX2 code, whose float16 GEMM keeps split accumulators in its one- and
two-row micro-kernels. Each library can be told to use its AVX2 code on an AVX-512 CPU:
``FBGEMM_ENABLE_INSTRUCTIONS=AVX2`` (read by FBGEMM's ``fbgemmInstructionSet``),
``ATEN_CPU_CAPABILITY=avx2`` and ``MKL_ENABLE_INSTRUCTIONS=AVX2``. This test re-runs the
checks of batch invariance and cache exactness in a subprocess with those variables set,
after making sure they took effect: ATen reports AVX2, and FBGEMM's one-row call differs
from the same row in a six-row call (the AVX2 micro-kernel's split accumulators). On a CPU
without AVX-512 the variables change nothing and the checks run on the native paths again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llamppl.lm.hf.fast_linear import fp16_gemm_supported

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not fp16_gemm_supported(), reason="torch build without FBGEMM"),
]

ROOT = Path(__file__).resolve().parents[2]
AVX2 = {
    "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}
#: what the subprocess re-runs (about 35 s): the kernel's row rule, the bitwise checks of the
#: embedded model (float16 and float32 weights beside 1, 3 and 8 other rows, after other
#: contexts were cached, below a long prompt) and the cache's exactness against fresh forwards.
#: ``run_many``'s jobs and the eviction run build on the same forward and run natively only.
CHECKS = [
    "tests/lm/test_fast_linear.py::test_a_rows_output_is_the_same_in_every_call_of_a_multiple_of_six_rows",
    "tests/lm/test_batch_invariant.py",
    "tests/lm/test_cached_causal_lm.py::test_branching_tree_equals_fresh_forward",
    "-k",
    "rows_output or bitwise_the_same_beside or whatever_was_cached or (long_prompt and default) "
    "or branching_tree",
]
CANARY = """
import torch
assert torch.backends.cpu.get_cpu_capability() == "AVX2", torch.backends.cpu.get_cpu_capability()
gen = torch.Generator().manual_seed(0)
w = torch.ops.quantized.linear_prepack_fp16(torch.randn(256, 576, generator=gen), None)
x = torch.randn(6, 576, generator=gen)
one = torch.ops.quantized.linear_dynamic_fp16(x[:1].contiguous(), w)[0]
six = torch.ops.quantized.linear_dynamic_fp16(x, w)[0]
assert not torch.equal(one, six), "FBGEMM did not run its AVX2 kernels"
"""


def avx2_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return {**env, **AVX2}


def test_batch_invariance_and_exactness_hold_on_the_avx2_kernels():
    env = avx2_env()
    canary = subprocess.run(
        [sys.executable, "-c", CANARY], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert canary.returncode == 0, canary.stderr[-2000:]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *CHECKS],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout
