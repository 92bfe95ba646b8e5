#!/usr/bin/env bash
# Set up the environment (first run: several minutes) and run the whole test suite, then
# the base install's check in its own light environment (scripts/test_light.sh).
# Extra arguments go to pytest and run the main suite only, e.g. `scripts/test.sh tests/core -x`.
# Exits non-zero when either run fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ "$#" -eq 0 ]; then
  scripts/test_light.sh || status=$?
fi
exit "$status"
