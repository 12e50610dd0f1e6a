#!/usr/bin/env bash
# Create .venv-genlm: a SEPARATE virtual environment with genlm-control 0.4.1 (the AWRS-SMC peer of
# benchmarks/bench_molecules.py and benchmarks/bench_patterns.py) and the task packages
# (partialsmiles, rdkit, regex). Nothing of genlm is imported by llamppl or committed: the peer
# script benchmarks/peers/genlm_awrs.py runs with this venv's Python.
#
# CPU torch is installed first (as scripts/setup.sh does), so pip never pulls a CUDA build.
# Exit codes: 0 ready; 75 the peer is not installable here (callers SKIP); anything else a failure.
# Override the venv with LLAMPPL_GENLM_VENV and the requirement with LLAMPPL_GENLM_SPEC.
#
#     bash scripts/setup-genlm.sh && .venv-genlm/bin/python benchmarks/peers/genlm_awrs.py --help
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${LLAMPPL_GENLM_VENV:-.venv-genlm}
SPEC=${LLAMPPL_GENLM_SPEC:-genlm-control==0.4.1}
TASK_PACKAGES=(partialsmiles rdkit regex)

source scripts/venv_lib.sh
make_venv
skip_if_unavailable() {  # the registry has no such distribution: exit 75 (callers skip)
  if grep -q -E "No matching distribution|Could not find a version" "$LOG"; then
    tail -n 5 "$LOG" >&2
    echo "[setup-genlm] SKIP: '$1' is not available from this registry" >&2
    exit 75
  fi
  cat "$LOG" >&2
  exit 1
}

install_cpu_torch "[setup-genlm]"

if ! "$PY" -P -c "import genlm.control, genlm.backend" 2>/dev/null; then
  echo "[setup-genlm] installing $SPEC (with genlm-backend, transformers)"
  if ! "$PY" -m pip --disable-pip-version-check install "$SPEC" >"$LOG" 2>&1; then
    skip_if_unavailable "$SPEC"
  fi
fi

if ! "$PY" -P -c "import partialsmiles, rdkit, regex" 2>/dev/null; then
  echo "[setup-genlm] installing ${TASK_PACKAGES[*]}"
  if ! "$PY" -m pip --disable-pip-version-check install "${TASK_PACKAGES[@]}" >"$LOG" 2>&1; then
    skip_if_unavailable "${TASK_PACKAGES[*]}"
  fi
fi

# The peer loads the SmolLM2 copy that our CachedCausalLM.default() converts into ~/.cache/llamppl
# (by local path: no hub access). Create it with OUR venv if it is missing.
MODEL_DIR=${LLAMPPL_PEER_MODEL:-$HOME/.cache/llamppl/SmolLM2-135M-Instruct-fp32}
if [ ! -f "$MODEL_DIR/config.json" ]; then
  echo "[setup-genlm] converting the embedded SmolLM2 with .venv (scripts/setup.sh first if missing)"
  HF_HUB_OFFLINE=1 .venv/bin/python -c "from llamppl import CachedCausalLM; CachedCausalLM.default()"
fi
HF_HUB_OFFLINE=1 "$PY" -P - <<PY
import importlib.metadata as md
import torch
from genlm.control import AWRS, PromptedLLM  # noqa: F401  (the peer's imports)
from genlm.backend.llm import AsyncTransformer  # noqa: F401
print(
    f"[setup-genlm] ready: genlm-control {md.version('genlm-control')}, "
    f"genlm-backend {md.version('genlm-backend')}, partialsmiles {md.version('partialsmiles')}, "
    f"rdkit {md.version('rdkit')}, torch {torch.__version__}"
)
PY
