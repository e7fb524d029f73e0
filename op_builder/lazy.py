"""The one loader behind every historical module name (apex_C, amp_C, fused_layer_norm_cuda, ...).

compatibility/<name>.py is three lines: importing it costs nothing, and the first
attribute access finds a prebuilt module, else a cached build, else compiles.
"""
from __future__ import annotations

from typing import Callable


def lazy_module_getattr(module_name: str) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """Module-level __getattr__ and __dir__ (PEP 562) that forward to the compiled op."""

    def __getattr__(attr: str) -> object:
        if attr.startswith("__") and attr.endswith("__"):  # import machinery probes; never compile for them
            raise AttributeError(f"module '{module_name}' has no attribute '{attr}'")
        from op_builder.jit import load_op

        return getattr(load_op(module_name), attr)

    def __dir__() -> list[str]:
        from op_builder.jit import load_op

        return sorted(name for name in dir(load_op(module_name)) if not name.startswith("__"))

    return __getattr__, __dir__
