#!/usr/bin/env bash
# Set up the environment (first run: several minutes) and run the whole test suite.
# Extra arguments go to pytest, e.g. `scripts/test.sh tests/core -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/python -m pytest "$@"
