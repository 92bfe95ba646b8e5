#!/usr/bin/env bash
# The packages as a user installs them before a release on PyPI: scripts/build_dists.sh
# builds the four wheels and sdists into dist/ (and `twine check`s them), then
#
# - every wheel and sdist carries the licence (in a wheel .dist-info/licenses/LICENSE,
#   named by License-File), the repository's LICENSE; the integrations' copies equal it;
# - an environment on the main .venv's Python (3.11) gets `langchain-agentspec` and
#   `agentspec-rl` with `pip install --find-links dist`, which must bring `vllm-agentspec`
#   from dist/ as their requirement; agentspec (client, wire contract, command) and both
#   integrations import from there, and none of numpy, arctic-inference, torch or vLLM is
#   installed;
# - one on Python 3.12 (the interpreter of scripts/test_openhands.sh) gets
#   `openhands-agentspec` the same way, meanwhile; it imports, without vLLM or torch.
#
# The environments, .cache/dists/base and .cache/dists/openhands, are made anew whenever the
# wheels' requirements, this script or the interpreter changed; otherwise only the agentspec
# distributions are removed and installed again from dist/ (their requirements already in
# place, as a fresh resolution would put them). pip's cache serves what is downloaded again;
# bytecode is not compiled at install. scripts/test.sh runs this as its `dists` stage; it
# also runs on its own (after scripts/bootstrap.sh):
#
#   scripts/test_dists.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
HEAVY="numpy arctic_inference torch vllm"
OURS="vllm-agentspec langchain-agentspec openhands-agentspec agentspec-rl"

source scripts/lib/venvs.sh
PY312="$(find_python312)"
if [ ! -x .venv/bin/python ]; then
  echo "test_dists: needs .venv (run scripts/bootstrap.sh first)" >&2
  exit 1
fi
PY311="$(.venv/bin/python -c 'import sys; print(sys._base_executable)')"

t0="$(now)"
scripts/build_dists.sh
echo "built and checked: $(elapsed "$t0") s"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# The licence in every wheel and sdist; the wheels' requirements (what decides the
# environments below) to $WORK/requires.txt.
.venv/bin/python - "$ROOT" "$WORK/requires.txt" <<'PY'
import sys
import tarfile
import zipfile
from pathlib import Path

root, requires = Path(sys.argv[1]), Path(sys.argv[2])
licence = (root / "LICENSE").read_bytes()
for name in ("langchain", "openhands", "rl"):
    copy = root / "integrations" / name / "LICENSE"
    if not copy.is_file() or copy.read_bytes() != licence:
        sys.exit(f"{copy.relative_to(root)} must be a copy of LICENSE")
expected = {"vllm_agentspec", "langchain_agentspec", "openhands_agentspec", "agentspec_rl"}
wheels = sorted((root / "dist").glob("*.whl"))
sdists = sorted((root / "dist").glob("*.tar.gz"))
for kind, files in (("wheels", wheels), ("sdists", sdists)):
    names = sorted(f.name.split("-")[0] for f in files)
    if names != sorted(expected):
        sys.exit(f"dist/ {kind}: {sorted(f.name for f in files)}; expected one of each of {sorted(expected)}")
lines = []
for wheel in wheels:
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(f"{dist_info}/METADATA").decode().splitlines()
        carried = z.read(f"{dist_info}/licenses/LICENSE") if f"{dist_info}/licenses/LICENSE" in z.namelist() else None
    if carried is None:
        sys.exit(f"{wheel.name} carries no licence file ({dist_info}/licenses/LICENSE)")
    if carried != licence:
        sys.exit(f"{wheel.name}: its LICENSE differs from the repository's")
    for field in ("License-Expression: Apache-2.0", "License-File: LICENSE"):
        if field not in metadata:
            sys.exit(f"{wheel.name}: METADATA lacks {field!r}")
    lines += [f"{dist_info} {line}" for line in metadata if line.startswith(("Requires-Dist:", "Requires-Python:"))]
for sdist in sdists:
    with tarfile.open(sdist) as t:
        member = t.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/LICENSE")
        if member is None or member.read() != licence:
            sys.exit(f"{sdist.name}: no LICENSE, or not the repository's")
requires.write_text("\n".join(lines) + "\n")
print(f"licence: in all {len(wheels)} wheels and {len(sdists)} sdists")
PY

# install_from_dist VENV PYTHON REQUIREMENT...: REQUIREMENTs into VENV from dist/ (and the
# index, for what is not ours); every agentspec distribution must come from dist/, and
# none of $HEAVY may be installed.
no_install() { :; }
install_from_dist() {
  local venv="$1" py="$2" t report
  shift 2
  t="$(now)"
  report="$WORK/$(basename "$venv").json"
  build_env "$venv" "$py" no_install "$WORK/requires.txt" scripts/test_dists.sh scripts/lib/venvs.sh
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pip uninstall -q -y $OURS 2>&1 | { grep -v "not installed" || true; }
  pip_in "$venv" --find-links "$ROOT/dist" --report "$report" "$@"
  .venv/bin/python - "$report" "$ROOT/dist" "$*" <<'PY'
import json
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

report, dist, requested = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]), sys.argv[3]
ours = {}
for item in report["install"]:
    name = item["metadata"]["name"]
    if "agentspec" in name:
        ours[name] = Path(unquote(urlparse(item["download_info"]["url"]).path))
if "vllm-agentspec" not in ours:
    sys.exit(f"{requested}: vllm-agentspec was not installed with it")
for name, path in sorted(ours.items()):
    if path.parent != dist:
        sys.exit(f"{requested}: {name} came from {path}, not from dist/")
print(f"{requested}: {len(report['install'])} installed now; {', '.join(sorted(ours))} from dist/")
PY
  check_absent "$venv" "$HEAVY" "$*"
  echo "$* ready: $(elapsed "$t") s"
}

# OpenHands on Python 3.12, in the background (its first install is the longest).
openhands() {
  local venv=.cache/dists/openhands
  install_from_dist "$venv" "$PY312" openhands-agentspec
  LITELLM_LOCAL_MODEL_COST_MAP=True OPENHANDS_SUPPRESS_BANNER=1 "$venv/bin/python" -I -c '
import sys
import agentspec, openhands_agentspec
from openhands_agentspec import AgentspecTask, agentspec_llm
where = {m.__name__: m.__file__ for m in (agentspec, openhands_agentspec)}
assert all(f.startswith(sys.prefix) for f in where.values()), where
heavy = [m for m in ("torch", "vllm", "arctic_inference") if m in sys.modules]
assert not heavy, heavy
print(f"openhands-agentspec imports on Python {sys.version.split()[0]}")
'
}

# The base install with the LangChain and RL packages, on the main .venv's Python.
base() {
  local venv=.cache/dists/base
  install_from_dist "$venv" "$PY311" langchain-agentspec agentspec-rl
  "$venv/bin/python" -I -c '
import sys
import agentspec, agentspec.cli, agentspec.client, agentspec.wire, agentspec_rl, langchain_agentspec
from langchain_agentspec import ChatAgentSpec
from agentspec_rl import RolloutClient
where = {m.__name__: m.__file__ for m in (agentspec, agentspec_rl, langchain_agentspec)}
assert all(f.startswith(sys.prefix) for f in where.values()), where
heavy = [m for m in ("numpy", "arctic_inference", "torch", "vllm") if m in sys.modules]
assert not heavy, heavy
print(f"vllm-agentspec, langchain-agentspec and agentspec-rl import on Python {sys.version.split()[0]}")
'
  "$venv/bin/agentspec" --help >/dev/null
  echo "agentspec --help: exit 0"
}

mkdir -p .cache/dists
openhands >"$WORK/openhands.log" 2>&1 &
openhands_pid=$!
base &
base_pid=$!
base_rc=0 openhands_rc=0
wait "$base_pid" || base_rc=$?
wait "$openhands_pid" || openhands_rc=$?
cat "$WORK/openhands.log"
if [ "$base_rc" != 0 ] || [ "$openhands_rc" != 0 ]; then
  echo "test_dists: FAILED (base and LangChain: exit $base_rc; OpenHands: exit $openhands_rc)" >&2
  exit 1
fi
echo "test_dists: passed in $(elapsed "$t0") s"
