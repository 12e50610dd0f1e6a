#!/usr/bin/env bash
# Set up .venv and run the main demo: SMC steering with a hard constraint on the embedded SmolLM2.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/quickstart.py "$@"
