"""apex.contrib.optimizers: optimizers whose state is sharded over the ranks of a
torch.distributed process group (ZeRO-2), updated by apex's fused multi-tensor kernels."""
from apex.contrib.optimizers.distributed_fused_adam import DistributedFusedAdam
from apex.contrib.optimizers.distributed_fused_lamb import DistributedFusedLAMB

__all__ = ["DistributedFusedAdam", "DistributedFusedLAMB"]
