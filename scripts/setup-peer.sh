#!/usr/bin/env bash
# Create .venv-peer: a SEPARATE virtual environment with genlm/llamppl 0.2.3 (PyPI name `llamppl`,
# the library ours is measured against in benchmarks/bench_peer.py). It has the same import name
# as this project, so it must never share .venv. Nothing of it is committed or imported by us:
# bench_peer.py runs it in a subprocess of this venv's Python.
#
# CPU torch is installed first (as scripts/setup.sh does), so pip never pulls a CUDA build.
# Exit codes: 0 ready; 75 the peer is not installable here (callers SKIP); anything else a failure.
# Override the venv with LLAMPPL_PEER_VENV and the requirement with LLAMPPL_PEER_SPEC.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${LLAMPPL_PEER_VENV:-.venv-peer}
SPEC=${LLAMPPL_PEER_SPEC:-llamppl==0.2.3}

source scripts/venv_lib.sh
make_venv

install_cpu_torch "[setup-peer]"

if ! "$PY" -P -c "import llamppl, genlm.backend" 2>/dev/null; then
  echo "[setup-peer] installing $SPEC (with genlm-backend, transformers)"
  if ! "$PY" -m pip --disable-pip-version-check install "$SPEC" >"$LOG" 2>&1; then
    if grep -q -E "No matching distribution|Could not find a version" "$LOG"; then
      tail -n 5 "$LOG" >&2
      echo "[setup-peer] SKIP: '$SPEC' is not available from this registry" >&2
      exit 75
    fi
    cat "$LOG" >&2
    exit 1
  fi
fi

# The peer loads the SmolLM2 copy that our CachedCausalLM.default() converts into ~/.cache/llamppl
# (by local path: no hub access). Create it with OUR venv if it is missing.
MODEL_DIR=${LLAMPPL_PEER_MODEL:-$HOME/.cache/llamppl/SmolLM2-135M-Instruct-fp32}
if [ ! -f "$MODEL_DIR/config.json" ]; then
  echo "[setup-peer] converting the embedded SmolLM2 with .venv (scripts/setup.sh first if missing)"
  HF_HUB_OFFLINE=1 .venv/bin/python -c "from llamppl.lm.hf.embedded import load_embedded; load_embedded()"
fi
HF_HUB_OFFLINE=1 "$PY" -P - <<PY
import importlib.metadata as md
import llamppl, torch
from genlm.backend.llm import load_model_by_name  # noqa: F401  (the peer's backend imports)
print(f"[setup-peer] ready: llamppl {md.version('llamppl')} from {llamppl.__file__}, torch {torch.__version__}")
PY
