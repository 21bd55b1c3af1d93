#!/usr/bin/env bash
# The test suite, set-up included: lint, then every test (real-capture tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check traceguard api tests bench scripts
.venv/bin/python -m pytest -q "$@"
