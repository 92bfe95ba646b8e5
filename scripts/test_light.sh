#!/usr/bin/env bash
# The base install's check: a separate virtual environment, .venv-light, on Python 3.12
# with `vllm-agentspec[test]`, the LangChain package and the RL rollout library only (the
# client, the wire contract and the test tools; no draft index, no vLLM). Fails if numpy, arctic-inference,
# torch or vLLM is installed there, then runs the client's, the wire contract's and the
# LangChain and RL packages' tests in it (tests that need a real vLLM server skip, with the
# reason). scripts/test.sh runs it after the main
# suite; it also runs on its own:
#
#   scripts/test_light.sh [PYTEST ARGS]
#
# Idempotent: the environment is rebuilt only when pyproject.toml, this script or the
# interpreter changed. AGENTSPEC_LIGHT_PYTHON chooses the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-light
HEAVY="numpy arctic_inference torch vllm"

source scripts/lib/venvs.sh
PY="$(find_python312)"

install_light() {
  # What users install: the client (with the stub server and test tools) and the
  # LangChain package. Neither may bring numpy, the suffix tree, torch or vLLM.
  pip_in "$1" -e ".[test]" -e integrations/langchain -e integrations/rl
  check_absent "$1" "$HEAVY" "vllm-agentspec[test] + langchain-agentspec + agentspec-rl"
  # LangChain's standard test suites need numpy themselves; the rest stays out.
  pip_in "$1" -e "integrations/langchain[test]"
  check_absent "$1" "arctic_inference torch vllm" "langchain-agentspec[test]"
}
build_env "$VENV" "$PY" install_light \
  pyproject.toml integrations/langchain/pyproject.toml integrations/rl/pyproject.toml scripts/test_light.sh \
  scripts/lib/venvs.sh

import_ms() {  # best of three fresh processes, import only (interpreter start-up excluded)
  local python="$1"
  for _ in 1 2 3; do
    "$python" -c 'import time; t = time.perf_counter(); import agentspec.client; print(f"{(time.perf_counter() - t) * 1000:.0f}")'
  done | sort -n | head -1
}
echo "import agentspec.client: $(import_ms "$VENV/bin/python") ms"

"$VENV/bin/python" -m pytest -q tests/client tests/test_wire.py tests/core/test_budget.py tests/test_light_install.py \
  integrations/langchain/tests/unit_tests integrations/rl/tests "$@"
