"""Names that moved keep working for a release (CHANGELOG, "Changed"): importing one gives
the object at its new home and a DeprecationWarning naming that home. Each import runs in a
fresh interpreter, where the old module has not been imported yet."""

from __future__ import annotations

import subprocess
import sys

import pytest

MOVED = [
    ("agentspec.policy", "DraftPolicy", "agentspec.index.policy"),
    ("agentspec.policy", "IndexConfig", "agentspec.index.policy"),
    ("agentspec.engine.middleware", "SessionIdMiddleware", "agentspec.engine.api_server.middleware"),
    ("agentspec.engine.config", "EngineSettings", "agentspec.engine.settings"),
    ("agentspec.engine.config", "ENV_CONFIG", "agentspec.engine.settings"),
    ("agentspec.engine.serve", "default_speculative_config", "agentspec.engine.launcher.serve"),
]


@pytest.mark.parametrize(("old", "name", "new"), MOVED, ids=[f"{o}.{n}" for o, n, _ in MOVED])
def test_a_moved_name_still_imports_and_says_where_it_went(old: str, name: str, new: str) -> None:
    code = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({new!r})\n"
        f"assert getattr(old, {name!r}) is getattr(new, {name!r})\n"
        "messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]\n"
        f"assert any({new!r} in m for m in messages), messages\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
