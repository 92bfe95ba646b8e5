#!/usr/bin/env bash
# Set up the environment (first run: several minutes) and run the whole test suite, then
# the base install's check in its own light environment (scripts/test_light.sh), the
# OpenHands package's tests in their Python 3.12 environment (scripts/test_openhands.sh) and
# the verl adapter's in verl's own environment (scripts/test_verl.sh); it also builds the
# documentation site strictly (scripts/build_docs.sh).
# Extra arguments go to pytest and run the main suite only, e.g. `scripts/test.sh tests/core -x`.
# Exits non-zero when either run fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
# Debian's packages the tests use for real: bubblewrap (the example harness confines
# model-written commands with it) and redis-server (the Redis exchange's tests). Where one
# cannot be had, its tests skip, saying so.
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v redis-server >/dev/null || missing+=(redis-server)
if [ "${#missing[@]}" -gt 0 ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null) \
    || echo "test.sh: could not install ${missing[*]}; their tests will skip" >&2
fi
status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ "$#" -eq 0 ]; then
  # Engines as Ray actors: apart, once the main run's servers have stopped.
  .venv/bin/python -m pytest -m ray integrations/rl/tests || status=$?
  scripts/build_docs.sh || status=$?
  scripts/test_light.sh || status=$?
  scripts/test_openhands.sh || status=$?
  scripts/test_verl.sh || status=$?
fi
exit "$status"
