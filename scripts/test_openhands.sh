#!/usr/bin/env bash
# The OpenHands package's tests, in their own virtual environment, .venv-openhands, on
# Python 3.12 (openhands-sdk needs >= 3.12; vLLM's CPU build lives in the main .venv on
# 3.11). It holds openhands-agentspec with openhands-sdk, openhands-tools, vllm-router and
# agentspec's light client; no vLLM, torch or suffix tree. The real servers the tests talk
# to run under the main environment's interpreter ($AGENTSPEC_SERVER_PYTHON, by default
# .venv/bin/python, made by scripts/bootstrap.sh). scripts/test.sh runs it after the light
# install's check; it also runs on its own:
#
#   scripts/test_openhands.sh [PYTEST ARGS]
#
# Idempotent: the environment is rebuilt only when a pyproject.toml, this script or the
# interpreter changed. AGENTSPEC_LIGHT_PYTHON chooses the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-openhands

source scripts/lib/venvs.sh
PY="$(find_python312)"
SERVER_PYTHON="${AGENTSPEC_SERVER_PYTHON:-$PWD/.venv/bin/python}"
if [ ! -x "$SERVER_PYTHON" ]; then
  echo "test_openhands: the servers need $SERVER_PYTHON (run scripts/bootstrap.sh first)" >&2
  exit 1
fi

install_openhands() {
  local t0
  t0="$(now)"
  # What a user installs, then the test tools (openhands-tools, vllm-router, pytest).
  pip_in "$1" -e . -e integrations/openhands
  check_absent "$1" "arctic_inference torch vllm" "openhands-agentspec"
  echo "openhands-agentspec installed: $(du -sm "$1" | cut -f1) MB, $(elapsed "$t0") s"
  pip_in "$1" -e ".[test]" -e "integrations/openhands[test]"
  check_absent "$1" "arctic_inference torch vllm" "openhands-agentspec[test]"
}
build_env "$VENV" "$PY" install_openhands \
  pyproject.toml integrations/openhands/pyproject.toml scripts/test_openhands.sh scripts/lib/venvs.sh

cd integrations/openhands
AGENTSPEC_SERVER_PYTHON="$SERVER_PYTHON" "../../$VENV/bin/python" -m pytest -q tests "$@"
