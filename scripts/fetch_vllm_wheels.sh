#!/usr/bin/env bash
# Download the vLLM wheels whose files the contract tests check statically (the releases in
# agentspec.engine.vllm.surface.SURFACE_CHECKED_RELEASES) into .cache/vllm-wheels/.
# Only the wheel, no dependencies: it is read as a zip, never installed (a CUDA build does
# not import without CUDA). pip's cache makes a second download quick.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/vllm-wheels
mkdir -p "$dest"
releases=$(.venv/bin/python -c 'from agentspec.engine.vllm.surface import SURFACE_CHECKED_RELEASES as r; print(" ".join(r))')
for release in $releases; do
  if compgen -G "$dest/vllm-$release-*.whl" >/dev/null; then
    continue
  fi
  .venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --python-version 3.11 -d "$dest" "vllm==$release"
done
ls "$dest"
