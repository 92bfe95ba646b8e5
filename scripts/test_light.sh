#!/usr/bin/env bash
# The base install's check: a separate virtual environment, .venv-light, on Python 3.12
# with `vllm-agentspec[test]` and the LangChain package only (the client, the wire
# contract and the test tools; no draft index, no vLLM). Fails if numpy, arctic-inference,
# torch or vLLM is installed there, then runs the client's, the wire contract's and the
# LangChain package's unit tests in it (tests that need a real vLLM server skip, with the
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

find_python() {
  local root py
  if root="$(pyenv root 2>/dev/null)"; then
    for py in "$root"/versions/3.12*/bin/python3.12; do
      [ -x "$py" ] && { echo "$py"; return 0; }
    done
  fi
  command -v python3.12
}
PY="${AGENTSPEC_LIGHT_PYTHON:-}"
if [ -z "$PY" ] && ! PY="$(find_python)"; then
  echo "test_light: needs Python 3.12 (pyenv's, or python3.12 on PATH) and found none;" \
    "set AGENTSPEC_LIGHT_PYTHON to one" >&2
  exit 1
fi

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

echo "== light install: $VENV on $("$PY" --version 2>&1)"
t0="$(now)"
stamp="$VENV/.agentspec-light-stamp"
want="$( (cat pyproject.toml integrations/langchain/pyproject.toml scripts/test_light.sh; "$PY" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)"
check_absent() {  # check_absent "MODULES" WHAT: fail when any of MODULES is installed
  "$VENV/bin/python" - "$1" "$2" <<'PY'
import importlib.metadata
import importlib.util
import sys

modules, what = sys.argv[1].split(), sys.argv[2]
present = [m for m in modules if importlib.util.find_spec(m) is not None]
if present:
    sys.exit(f"test_light: {what} must not install {', '.join(present)}")
print(f"{what}: {len(list(importlib.metadata.distributions()))} packages installed; none of {' '.join(modules)}")
PY
}
pip_light() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"; }

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "environment up to date ($(elapsed "$t0") s)"
else
  rm -rf "$VENV"  # from scratch: a package an older pyproject pulled in must not linger
  "$PY" -m venv "$VENV"
  # What users install: the client (with the stub server and test tools) and the
  # LangChain package. Neither may bring numpy, the suffix tree, torch or vLLM.
  pip_light -e ".[test]" -e integrations/langchain
  check_absent "$HEAVY" "vllm-agentspec[test] + langchain-agentspec"
  # LangChain's standard test suites need numpy themselves; the rest stays out.
  pip_light -e "integrations/langchain[test]"
  check_absent "arctic_inference torch vllm" "langchain-agentspec[test]"
  echo "$want" > "$stamp"
  echo "environment created ($(elapsed "$t0") s)"
fi

import_ms() {  # best of three fresh processes, import only (interpreter start-up excluded)
  local python="$1"
  for _ in 1 2 3; do
    "$python" -c 'import time; t = time.perf_counter(); import agentspec.client; print(f"{(time.perf_counter() - t) * 1000:.0f}")'
  done | sort -n | head -1
}
echo "import agentspec.client: $(import_ms "$VENV/bin/python") ms"

"$VENV/bin/python" -m pytest -q tests/client tests/test_wire.py tests/core/test_budget.py tests/test_light_install.py \
  integrations/langchain/tests/unit_tests "$@"
