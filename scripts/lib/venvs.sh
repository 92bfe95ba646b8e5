# Helpers for the test environments of scripts/test_light.sh, scripts/test_openhands.sh and
# scripts/test_verl.sh (sourced, not run). Each environment is rebuilt from scratch
# only when what decides it changed (a stamp of the files that define it).

# The interpreter: $AGENTSPEC_LIGHT_PYTHON, else pyenv's 3.12, else python3.12 on PATH.
find_python312() {
  local root py
  if [ -n "${AGENTSPEC_LIGHT_PYTHON:-}" ]; then echo "$AGENTSPEC_LIGHT_PYTHON"; return 0; fi
  if root="$(pyenv root 2>/dev/null)"; then
    for py in "$root"/versions/3.12*/bin/python3.12; do
      [ -x "$py" ] && { echo "$py"; return 0; }
    done
  fi
  command -v python3.12 || {
    echo "needs Python 3.12 (pyenv's, or python3.12 on PATH) and found none;" \
      "set AGENTSPEC_LIGHT_PYTHON to one" >&2
    return 1
  }
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# stamp_of PYTHON FILE...: what decides an environment (the files and the interpreter).
stamp_of() {
  local py="$1"
  shift
  (cat "$@"; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16
}

# build_env VENV PYTHON INSTALLER FILE...: unless VENV was built from the same FILEs and
# interpreter, make it anew (from scratch: a package an older pyproject pulled in must not
# linger) and run INSTALLER VENV, a function that installs into it.
build_env() {
  local venv="$1" py="$2" installer="$3" t0 want stamp
  shift 3
  t0="$(now)"
  stamp="$venv/.agentspec-stamp"
  want="$(stamp_of "$py" "$@")"
  echo "== $venv on $("$py" --version 2>&1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "environment up to date"
    return 0
  fi
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$installer" "$venv"
  echo "$want" > "$stamp"
  echo "environment created ($(elapsed "$t0") s)"
}

# check_absent VENV "MODULES" WHAT: fail when any of MODULES is installed in VENV.
check_absent() {
  "$1/bin/python" - "$2" "$3" <<'PY'
import importlib.metadata
import importlib.util
import sys

modules, what = sys.argv[1].split(), sys.argv[2]
present = [m for m in modules if importlib.util.find_spec(m) is not None]
if present:
    sys.exit(f"{what} must not install {', '.join(present)}")
print(f"{what}: {len(list(importlib.metadata.distributions()))} packages installed; none of {' '.join(modules)}")
PY
}

# pip_in VENV ARGS...: quiet pip in that environment. No byte-compiling at install (about half
# of an install's time): Python compiles what a test imports, once, when it imports it.
pip_in() {
  local venv="$1"
  shift
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile "$@"
}
