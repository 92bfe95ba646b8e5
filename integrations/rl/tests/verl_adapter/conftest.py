"""verl's tests run in their own environment (scripts/test_verl.sh builds ``.venv-verl``,
with verl 0.9 and no vLLM): verl pins ``transformers<5.11``, vLLM's CPU build in the main
``.venv`` needs a newer one. Where verl is not installed (the main run), nothing here is
collected."""

from __future__ import annotations

import importlib.util


def _has_verl() -> bool:
    try:
        return importlib.util.find_spec("verl.experimental.agent_loop") is not None
    except ImportError:
        return False


if not _has_verl():
    collect_ignore_glob = ["*.py"]
