"""The mixed-precision type in force, for apex's fused modules (apex.fused_dense, apex.mlp,
apex.transformer) that call their own kernels instead of torch functions amp could cast.

Inside a ``torch.autocast`` region floating tensor arguments are cast to the autocast dtype
(NVIDIA/ROCm apex's ``_cast_if_autocast_enabled``). While amp's O1/O4 casts are installed
(``amp.init`` or ``amp.initialize(opt_level="O1"|"O4")``) they are cast to the type amp's lists
cast to: float16 (O1) or bfloat16 (O4). Elsewhere they pass unchanged: amp O2/O5 cast the model's
weights and inputs themselves. ``import apex._autocast`` imports neither apex.amp nor any op.
"""
from __future__ import annotations

import sys
from typing import Optional

import torch


def amp_cast_dtype() -> Optional[torch.dtype]:
    """The type amp's installed and active casts convert to, or None (amp never imported, no casts
    installed, or inside ``amp.disable_casts()``)."""
    amp_state_module = sys.modules.get("apex.amp._amp_state")
    if amp_state_module is None:
        return None
    handle = amp_state_module._amp_state.handle
    return handle.patch_type if handle.is_active() else None


def autocast_dtype(*args) -> Optional[torch.dtype]:
    """The type floating ``args`` should compute in: torch.autocast's for their device, else amp's."""
    if torch._C._is_any_autocast_enabled():  # one C call decides the common case
        device_type = next((a.device.type for a in args if isinstance(a, torch.Tensor)), None)
        if device_type is not None and torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    return amp_cast_dtype()


def cast_if_autocast_enabled(*args):
    """``args`` with floating tensors cast to the mixed-precision type in force, if any."""
    dtype = autocast_dtype(*args)
    if dtype is None:
        return args
    return tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
