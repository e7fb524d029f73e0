"""``import op_builder`` in the source tree: another name for ``apex.op_builder``, not a copy.

Loading the folder twice (as ``op_builder`` and as ``apex.op_builder``) would give two registries,
two "already loaded" tables and two ``OpBuildError`` classes that ``except`` clauses confuse. So
the old name is bound to the canonical modules: the package itself here, its submodules through
a finder that answers ``op_builder.<x>`` with ``apex.op_builder.<x>`` (``python -m
op_builder.<x>`` included). The wheel has no top-level ``op_builder``.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``<alias>.<x>`` as the already importable ``<canonical>.<x>``."""

    def __init__(self, alias: str, canonical: str) -> None:
        self.alias, self.canonical = alias, canonical

    def _canonical_name(self, name: str) -> str:
        return self.canonical + name[len(self.alias):]

    def find_spec(self, name, path=None, target=None):
        if not name.startswith(self.alias + "."):
            return None
        real = importlib.util.find_spec(self._canonical_name(name))
        if real is None:
            return None
        return importlib.util.spec_from_loader(name, self, origin=real.origin,
                                               is_package=real.submodule_search_locations is not None)

    def create_module(self, spec) -> ModuleType:
        module = importlib.import_module(self._canonical_name(spec.name))
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the alias spec on the shared module: give it back its own.
        module.__spec__ = module.__spec__.loader_state

    def get_code(self, name: str):
        """For ``python -m op_builder.<x>``: runpy runs the canonical module's code as __main__."""
        real = importlib.util.find_spec(self._canonical_name(name))
        return real.loader.get_code(real.name)

    def is_package(self, name: str) -> bool:
        return importlib.util.find_spec(self._canonical_name(name)).submodule_search_locations is not None


def alias_package(alias: str, canonical: str) -> None:
    """Make ``import alias[.x]`` return the modules of ``canonical[.x]``."""
    sys.modules[alias] = importlib.import_module(canonical)
    if not any(isinstance(f, _AliasFinder) and f.alias == alias for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder(alias, canonical))
