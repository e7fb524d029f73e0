"""How apex.parallel finds the torch.distributed process group it works on."""
from __future__ import annotations

import torch.distributed as dist


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def require_initialized(user: str) -> None:
    """Raise a RuntimeError naming ``user`` when torch.distributed has no default group."""
    if not is_initialized():
        raise RuntimeError(
            f"{user} needs torch.distributed to be initialized: call "
            "torch.distributed.init_process_group('nccl' or 'gloo', ...) first (torchrun sets the "
            "rendezvous environment variables)."
        )


def group_size(group, user: str) -> int:
    """World size of ``group`` (None = the default group), checking this rank belongs to it."""
    require_initialized(user)
    if group is not None and group == dist.GroupMember.NON_GROUP_MEMBER:
        raise RuntimeError(f"{user}: this rank (rank {dist.get_rank()}) is not a member of the given process group")
    return dist.get_world_size(group)
