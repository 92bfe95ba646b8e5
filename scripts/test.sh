#!/usr/bin/env bash
# Set up the environment (first run: several minutes), run the code's checks (scripts/lint.sh:
# ruff, mypy, import contracts) and the whole test suite, then
# the base install's check in its own light environment (scripts/test_light.sh), the
# engine's real-server suites on vLLM 0.34 (scripts/test_vllm034.sh), the
# OpenHands package's tests in their Python 3.12 environment (scripts/test_openhands.sh) and
# the verl adapter's in verl's own environment (scripts/test_verl.sh); it also builds the
# documentation site strictly (scripts/build_docs.sh), and the four distributions, which it
# installs from dist/ in environments of their own (scripts/test_dists.sh). Last, it fails if
# any process it started is still running (scripts/check_no_survivors.py).
# Extra arguments go to pytest and run the main suite only, e.g. `scripts/test.sh tests/core -x`.
# Exits non-zero when either run fails.
set -euo pipefail
cd "$(dirname "$0")/.."
# Every process the stages start inherits this id; the last stage fails on any still alive.
export AGENTSPEC_TEST_RUN="test-sh-$$-$(date +%s)"
status=0
stages=()
# stage NAME COMMAND...: run one stage, remember its wall time and whether it passed.
stage() {
  local name="$1" t0 rc=0
  shift
  t0=$SECONDS
  "$@" || rc=$?
  stages+=("$(printf '%-10s %5d s  %s' "$name" $((SECONDS - t0)) "$([ "$rc" = 0 ] && echo passed || echo "FAILED ($rc)")")")
  [ "$rc" = 0 ] || status=$rc
}
stage setup scripts/bootstrap.sh
[ "$status" = 0 ] || exit "$status"
# The vLLM releases checked from their files alone (the contract tests read the wheels).
stage wheels scripts/fetch_vllm_wheels.sh
# ruff, mypy and the import contracts: seconds, before the long runs.
stage lint scripts/lint.sh
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
# The real test model is built once per checkout (agentspec.testing.real_model).
export AGENTSPEC_REAL_MODEL_DIR="${AGENTSPEC_REAL_MODEL_DIR:-$PWD/.cache/real-model}"
# --durations: the slowest tests and set-ups of each run are printed, to keep CI's time in view.
stage main .venv/bin/python -m pytest --durations=20 "$@"
if [ "$#" -eq 0 ]; then
  # The engine's real-server suites on vLLM 0.34 (Model Runner V2) in .venv-vllm034; skips,
  # saying so, without a vLLM 0.34 CPU wheel (scripts/test_vllm034.sh).
  stage vllm034 scripts/test_vllm034.sh
  # Engines as Ray actors: apart, once the main run's servers have stopped.
  stage ray .venv/bin/python -m pytest --durations=5 -m ray integrations/rl/tests
  stage docs scripts/build_docs.sh
  stage light scripts/test_light.sh --durations=10
  stage openhands scripts/test_openhands.sh --durations=20
  stage verl scripts/test_verl.sh --durations=10
  # The four distributions built into dist/ and installed from there (scripts/test_dists.sh).
  stage dists scripts/test_dists.sh
fi
# Nothing the stages started may outlive them (vLLM engines, Ray, servers): each survivor named.
stage survivors .venv/bin/python scripts/check_no_survivors.py --grace 30
echo "== stages (wall time)"
printf '%s\n' "${stages[@]}"
exit "$status"
