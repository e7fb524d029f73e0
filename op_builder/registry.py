"""All ops, discovered from op_builder/ops/: adding an op never edits a list here."""
from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil

from . import ops as _ops_package
from .builder import CppOpBuilder, CUDAOpBuilder, OpBuilder

_BASES = (OpBuilder, CppOpBuilder, CUDAOpBuilder)


@functools.lru_cache(maxsize=None)
def all_builders() -> dict[str, type[OpBuilder]]:
    """NAME -> builder class, for every builder class defined in op_builder/ops/*.py."""
    found: dict[str, type[OpBuilder]] = {}
    for info in sorted(pkgutil.iter_modules(_ops_package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{_ops_package.__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, OpBuilder) and cls not in _BASES and cls.__module__ == module.__name__:
                if cls.NAME in found:
                    raise RuntimeError(f"two builders declare op '{cls.NAME}': "
                                       f"{found[cls.NAME].__module__} and {module.__name__}")
                found[cls.NAME] = cls
    return dict(sorted(found.items()))


def builder_for(name: str) -> OpBuilder:
    try:
        return all_builders()[name]()
    except KeyError:
        known = ", ".join(all_builders())
        raise KeyError(f"no apex op named '{name}' (known ops: {known})") from None
