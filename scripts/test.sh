#!/usr/bin/env bash
# Set up .venv and run the whole test suite (lint first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m ruff check .
.venv/bin/python -m ruff format --check .
.venv/bin/mkdocs build --strict -q -d "$(mktemp -d)"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
