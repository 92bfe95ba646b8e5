#!/usr/bin/env bash
# The code's own checks, as the test command runs them: ruff's lint and format check (the
# settings and rule set in pyproject.toml), mypy on agentspec/, and the import contracts
# (import-linter, [tool.importlinter] in pyproject.toml: the light modules import no
# numpy, arctic-inference, torch or vLLM; only agentspec.engine.vllm imports vLLM; the
# draft index imports no engine or framework; the engine's processes keep apart).
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
.venv/bin/ruff check . || status=1
.venv/bin/ruff format --check . || status=1
.venv/bin/mypy || status=1
.venv/bin/lint-imports || status=1
exit "$status"
