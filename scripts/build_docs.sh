#!/usr/bin/env bash
# Build the documentation site into site/ with `mkdocs build --strict` (a broken link or a
# page missing from the navigation fails it). Its benchmark report runs `agentspec bench
# --plot` on the bundled slice now; the CLI reference comes from the CLI itself
# (scripts/mkdocs_hooks.py). Needs the main environment (scripts/bootstrap.sh).
#
#   scripts/build_docs.sh [MKDOCS BUILD ARGS]
set -euo pipefail
cd "$(dirname "$0")/.."
NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict --site-dir site "$@"
