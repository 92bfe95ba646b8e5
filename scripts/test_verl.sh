#!/usr/bin/env bash
# The verl adapter's tests (agentspec_rl.verl), in their own virtual environment, .venv-verl:
# verl 0.9 pins transformers<5.11 and vLLM's CPU build in the main .venv needs a newer one,
# so they cannot share it. It holds verl (no vLLM, no SGLang; the CPU build of torch that
# the main .venv has), agentspec-rl and agentspec's light client. The tests drive verl's own
# agent loop worker and config; the real servers they talk to run under the main
# environment's interpreter ($AGENTSPEC_SERVER_PYTHON, by default .venv/bin/python, made by
# scripts/bootstrap.sh). Runs on its own:
#
#   scripts/test_verl.sh [PYTEST ARGS]
#
# Idempotent: the environment is rebuilt only when a pyproject.toml, this script or the
# interpreter changed. The interpreter is the main .venv's own Python (3.11), so that the CPU
# torch it was given fits here too; AGENTSPEC_VERL_PYTHON chooses another.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-verl
VERL="verl>=0.9.1,<0.10"

source scripts/lib/venvs.sh
SERVER_PYTHON="${AGENTSPEC_SERVER_PYTHON:-$PWD/.venv/bin/python}"
if [ ! -x "$SERVER_PYTHON" ]; then
  echo "test_verl: the servers need $SERVER_PYTHON (run scripts/bootstrap.sh first)" >&2
  exit 1
fi
PY="${AGENTSPEC_VERL_PYTHON:-$("$SERVER_PYTHON" -c 'import sys; print(sys._base_executable)')}"

install_verl() {
  local t0 cons
  t0="$(now)"
  # torch as the main .venv has it (the CPU build): PyPI's default build would bring CUDA.
  cons="$(mktemp)"
  "$SERVER_PYTHON" -c 'import torch; print(f"torch=={torch.__version__}")' > "$cons"
  # verl, what its agent loop modules import beyond its base requirements (verl-core's
  # cachetools, fastapi, uvicorn; TransferQueue for the V1 trainer's manager), then
  # agentspec-rl and the test tools.
  pip_in "$1" -c "$cons" "$VERL" cachetools fastapi uvicorn "TransferQueue>=0.1.10"
  pip_in "$1" -c "$cons" -e ".[test]" -e "integrations/rl[test]"
  rm -f "$cons"
  check_absent "$1" "vllm sglang arctic_inference" "verl + agentspec-rl"
  echo "verl installed: $(du -sm "$1" | cut -f1) MB, $(elapsed "$t0") s"
}
build_env "$VENV" "$PY" install_verl \
  pyproject.toml integrations/rl/pyproject.toml scripts/test_verl.sh scripts/lib/venvs.sh

cd integrations/rl
AGENTSPEC_SERVER_PYTHON="$SERVER_PYTHON" "../../$VENV/bin/python" -m pytest -q tests/verl_adapter \
  -W ignore::UserWarning -W ignore::DeprecationWarning "$@"
