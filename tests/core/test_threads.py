"""``llamppl.threads``: the CPU thread default applied by the loaders, and the user's choices that win.

Each case runs in a fresh interpreter, since the policy reads the thread count at
``import llamppl`` and applies once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llamppl.threads import default_num_threads


@pytest.mark.parametrize(
    ("cpus", "threads"), [(1, 1), (2, 1), (4, 1), (8, 2), (12, 3), (16, 4), (256, 4)]
)
def test_default_is_a_quarter_of_the_cpus_between_1_and_4(cpus, threads):
    assert default_num_threads(cpus) == threads


@pytest.mark.parametrize("cpus", [0, -2, 2.0, True, "2"])
def test_bad_cpu_count_is_refused(cpus):
    with pytest.raises(ValueError, match="cpus"):
        default_num_threads(cpus)


def threads_after(code: str, **env: str) -> str:
    """Run ``code`` after ``import llamppl`` in a fresh process; return its last printed line."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LLAMPPL_NUM_THREADS")
    }
    script = "import torch, llamppl\nfrom llamppl.threads import apply_default_threads\n" + code
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


LOAD = (
    "try:\n"
    "    llamppl.CachedCausalLM.from_pretrained('/nonexistent/model')\n"
    "except ValueError:\n"
    "    pass\n"
    "print(torch.get_num_threads())\n"
)


def test_loader_applies_the_default_on_cpu():
    from llamppl.threads import default_num_threads as d

    assert threads_after(LOAD) == str(d())


def test_environment_variable_sets_the_count():
    assert threads_after(LOAD, LLAMPPL_NUM_THREADS="3") == "3"


def test_users_own_set_num_threads_is_kept():
    assert threads_after("torch.set_num_threads(3)\n" + LOAD) == "3"


def test_omp_num_threads_is_kept():
    before, after = threads_after(
        "before = torch.get_num_threads()\n"
        + LOAD.replace("print(torch.get_num_threads())", "print(before, torch.get_num_threads())"),
        OMP_NUM_THREADS="2",
    ).split()
    assert before == after == "2"


def test_other_devices_and_second_loads_leave_threads_alone():
    code = (
        "before = torch.get_num_threads()\n"
        "assert apply_default_threads('meta') is None and torch.get_num_threads() == before\n"
        "first = apply_default_threads()\n"
        "torch.set_num_threads(3)\n"
        "assert apply_default_threads('cpu') is None\n"
        "print(first, torch.get_num_threads())\n"
    )
    first, now = threads_after(code).split()
    assert int(first) == default_num_threads() and now == "3"


def test_bad_environment_variable_is_named():
    out = subprocess.run(
        [sys.executable, "-c", "import llamppl.threads as t; t.apply_default_threads()"],
        env={**os.environ, "LLAMPPL_NUM_THREADS": "many"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "LLAMPPL_NUM_THREADS must be a positive integer" in out.stderr
