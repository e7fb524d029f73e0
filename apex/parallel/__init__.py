"""apex.parallel: data parallelism and synchronized batch norm on torch.distributed.

- :class:`DistributedDataParallel` all-reduces gradients in flat buckets, overlapped with
  backward; :class:`Reducer` all-reduces them when asked.
- :class:`SyncBatchNorm` normalizes with statistics of the global batch (parallel
  Welford merge, fused CPU/CUDA kernels); :func:`convert_syncbn_model` swaps a model's
  BatchNorm layers for it; :func:`create_syncbn_process_group` builds sub-groups.
- :class:`LARC` wraps an optimizer with layer-wise adaptive rate control.

Everything runs on PyTorch's distributed engine (NCCL for GPUs, gloo for CPUs). Launch
one process per GPU with torchrun::

    torchrun --nproc_per_node=NUM_GPUS train.py

and in ``train.py``::

    import os, torch
    import apex.parallel

    torch.distributed.init_process_group("nccl")   # "gloo" for CPU training
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = apex.parallel.convert_syncbn_model(build_model()).cuda()
    model = apex.parallel.DistributedDataParallel(model)
"""
from apex.parallel.convert_syncbn import convert_syncbn_model, create_syncbn_process_group
from apex.parallel.distributed import DistributedDataParallel, Reducer, flat_dist_call
from apex.parallel.LARC import LARC
from apex.parallel.sync_batchnorm import SyncBatchNorm

__all__ = [
    "DistributedDataParallel", "Reducer", "flat_dist_call", "SyncBatchNorm", "convert_syncbn_model",
    "create_syncbn_process_group", "LARC",
]
