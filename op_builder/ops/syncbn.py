from ..builder import CUDAOpBuilder


class SyncBatchNormBuilder(CUDAOpBuilder):
    """Welford statistics and batch-norm kernels for apex.parallel.SyncBatchNorm (NCHW and channels-last)."""

    NAME = "syncbn"
