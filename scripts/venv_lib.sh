# Shared by scripts/setup*.sh (sourced, not run): make a venv, run pip quietly, install CPU torch.
#
#   VENV=.venv-x; source scripts/venv_lib.sh; make_venv; install_cpu_torch "[setup-x]"
#   pip_quiet install some-package          # quiet; shows pip's log and fails when pip fails
#
# CPU torch goes in first so that pip never pulls a multi-GB CUDA build: the local CPU wheel
# (torch 2.13.0+cpu) when the machine has one, else PyTorch's CPU index, else PyPI;
# LLAMPPL_TORCH_INDEX chooses another index (e.g. a CUDA one on a GPU machine).

make_venv() {  # create $VENV with $PYTHON (default python3) unless it exists; sets PY and LOG
  if [ ! -x "$VENV/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$VENV"
  fi
  PY=$VENV/bin/python
  LOG=$VENV/setup-pip.log
}

pip_quiet() {  # run pip quietly; show its log and fail if it fails
  if ! "$PY" -m pip --disable-pip-version-check "$@" >"$LOG" 2>&1; then
    cat "$LOG" >&2
    return 1
  fi
}

install_cpu_torch() {  # install_cpu_torch TAG: a CPU torch unless the venv has a torch
  if "$PY" -P -c "import torch" 2>/dev/null; then
    return 0
  fi
  echo "$1 installing CPU torch"
  if [ -n "${LLAMPPL_TORCH_INDEX:-}" ]; then
    pip_quiet install torch --index-url "$LLAMPPL_TORCH_INDEX"
  else
    pip_quiet install "torch==2.13.0+cpu" \
      || pip_quiet install "torch>=2.4" --index-url https://download.pytorch.org/whl/cpu \
      || pip_quiet install "torch>=2.4"
  fi
}
