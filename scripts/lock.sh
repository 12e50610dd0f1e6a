#!/usr/bin/env bash
# Write requirements/ci.lock: the exact versions installed in a venv whose suite just passed.
#
#   bash scripts/lock.sh [VENV]      default .venv-latest (what `scripts/test.sh --latest` verified)
#
# Everything pip installed for llamppl and its extras is pinned with ==, except llamppl itself and
# torch: setup.sh installs torch on its own first (a CPU build from this machine's disk or a
# chosen index), and pinning a local version label such as +cpu would refuse GPU builds.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-latest}
[ -x "$VENV/bin/python" ] || { echo "lock.sh: no venv at $VENV" >&2; exit 2; }
OUT=requirements/ci.lock
TMP=$(mktemp)
{
  echo "# Exact versions last verified green by the full suite (scripts/test.sh), written by"
  echo "# scripts/lock.sh from $VENV on $(date -u +%Y-%m-%d); scripts/setup.sh installs with -c $OUT."
  echo "# Python $("$VENV/bin/python" -c 'import platform; print(platform.python_version())'), torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)') (installed separately, not pinned here)."
  "$VENV/bin/python" -m pip --disable-pip-version-check freeze --exclude-editable \
    | grep -v -i -E '^(llamppl|torch|nvidia-[a-z0-9-]+|triton)==' | LC_ALL=C sort -f
} >"$TMP"
if [ -f "$OUT" ]; then
  diff <(grep -v '^#' "$OUT") <(grep -v '^#' "$TMP") | grep '^[<>]' | sed 's/^</[lock] was/; s/^>/[lock] now/' || true
fi
mv "$TMP" "$OUT"
echo "[lock] wrote $OUT ($(grep -vc '^#' "$OUT") packages)"
