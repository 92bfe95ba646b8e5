"""Patch a vLLM module when a process first imports it.

vLLM's model runner is heavy (seconds to import) and only worker processes import it, so
the plugin patches it when it is imported rather than importing it itself.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

#: Set on a module once agentspec has patched it (patches run once per process).
PATCHED_ATTR = "_agentspec_patched"


def is_patched(module: ModuleType | None) -> bool:
    return bool(getattr(module, PATCHED_ATTR, False))


def mark_patched(module: ModuleType) -> None:
    setattr(module, PATCHED_ATTR, True)


def patch_when_imported(name: str, patch: Callable[[ModuleType], None]) -> None:
    """Run ``patch(module)`` on module ``name`` now if imported, else right after its import."""
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
    elif not any(isinstance(f, _PatchOnImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(name, patch))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after ``name`` is first imported, then steps aside."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.patch = patch

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # find the real module without finding ourselves
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PatchingLoader(spec.loader, self.patch)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # Hand the module its real loader before it runs, so source lookups (inspect,
        # linecache, torch.compile) behave as if no hook had been there.
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.patch(module)
