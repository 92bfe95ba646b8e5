#!/usr/bin/env bash
# Build the four distributions of this repository into dist/: a wheel and an sdist of each,
# then check them with `twine check --strict`.
#
#   scripts/build_dists.sh
#
#   vllm-agentspec       pyproject.toml
#   langchain-agentspec  integrations/langchain/pyproject.toml
#   openhands-agentspec  integrations/openhands/pyproject.toml
#   agentspec-rl         integrations/rl/pyproject.toml
#
# Until a release on PyPI this is how the packages are installed elsewhere:
#
#   pip install --find-links dist "vllm-agentspec[serve]"   # or langchain-agentspec, ...
#
# dist/ is emptied first, so it holds this checkout's distributions only. Each one is built
# by `python -m build` (an sdist, then the wheel from that sdist, in isolated build
# environments) from a copy of the files git tracks or would track (uncommitted changes
# included, ignored files such as egg-info and build/ left out), so nothing stale in the
# working tree reaches a wheel. The tools, build and twine, come from .venv (the dev extra)
# when it has them, else from a small environment of their own in .cache/build-tools.
# AGENTSPEC_BUILD_PYTHON names another interpreter that has both.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
OUT="$ROOT/dist"
PROJECTS=(. integrations/langchain integrations/openhands integrations/rl)

has_tools() { [ -x "$1" ] && "$1" -c "import build, twine" 2>/dev/null; }
if [ -n "${AGENTSPEC_BUILD_PYTHON:-}" ]; then
  PY="$AGENTSPEC_BUILD_PYTHON"
  has_tools "$PY" || { echo "build_dists: $PY lacks build or twine" >&2; exit 1; }
elif has_tools .venv/bin/python; then
  PY=.venv/bin/python
else
  PY=.cache/build-tools/bin/python
  if ! has_tools "$PY"; then
    echo "build_dists: installing build and twine into .cache/build-tools"
    "${PYTHON:-python3}" -m venv .cache/build-tools
    "$PY" -m pip install -q --disable-pip-version-check "build>=1.2" "twine>=6.1"
  fi
fi

# The sources: a copy of what git tracks or would track; without git, the working tree.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  SRC="$(mktemp -d)"
  trap 'rm -rf "$SRC"' EXIT
  git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
    | xargs -0 cp --parents -t "$SRC"
else
  SRC="$ROOT"
fi

rm -rf "$OUT"
mkdir -p "$OUT"
for project in "${PROJECTS[@]}"; do
  echo "== building $project"
  "$PY" -m build --outdir "$OUT" "$SRC/$project" >"$OUT/.build.log" 2>&1 || {
    cat "$OUT/.build.log" >&2
    echo "build_dists: building $project failed" >&2
    exit 1
  }
  grep -E '^Successfully built' "$OUT/.build.log" || true
done
rm -f "$OUT/.build.log"
"$PY" -m twine check --strict "$OUT"/*
