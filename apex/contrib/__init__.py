"""apex.contrib: NVIDIA apex's contributed extensions, each a subpackage imported on first use.

``apex.contrib.optimizers`` (or ``from apex.contrib import xentropy``) imports that subpackage
only then, so ``import apex.contrib`` costs nothing and one subpackage's missing op or
dependency never breaks another. A subpackage that is not part of this build raises
ImportError naming it, whichever way it is reached.
"""
from __future__ import annotations

import importlib
from types import ModuleType

# NVIDIA apex's contrib subpackages that this project provides.
SUBPACKAGES = (
    "clip_grad",
    "focal_loss",
    "group_norm",
    "index_mul_2d",
    "layer_norm",
    "optimizers",
    "transducer",
    "xentropy",
)

__all__ = list(SUBPACKAGES)


def __getattr__(name: str) -> ModuleType:
    if name not in SUBPACKAGES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    qualified = f"{__name__}.{name}"
    try:
        module = importlib.import_module(qualified)
    except ModuleNotFoundError as err:
        if err.name != qualified:  # the subpackage exists; something it imports does not
            raise
        raise ImportError(f"{qualified} is not part of this apex build", name=qualified) from None
    globals()[name] = module  # later lookups skip __getattr__
    return module


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(SUBPACKAGES))
