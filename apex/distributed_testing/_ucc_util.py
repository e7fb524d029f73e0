"""Whether torch.distributed can use the UCC backend (built into torch, or the torch_ucc plugin)."""
from __future__ import annotations

import importlib.util

from torch import distributed as dist


def _has_ucc() -> bool:
    if getattr(dist, "is_ucc_available", None) is not None and dist.is_ucc_available():
        return True
    # torch_ucc registers the backend when imported; finding it is enough to say it can be used.
    return importlib.util.find_spec("torch_ucc") is not None


HAS_UCC: bool = _has_ucc()
