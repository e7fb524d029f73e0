from op_builder.builder import CUDAOpBuilder


class SyncBatchNormBuilder(CUDAOpBuilder):
    """Welford statistics and batch-norm kernels for apex.parallel.SyncBatchNorm (NCHW and channels-last)."""

    NAME = "syncbn"
    CPP_SOURCES = ["syncbn/binding.cpp", "syncbn/syncbn_cpu.cpp"]
    CUDA_SOURCES = ["syncbn/reductions_cuda.cu", "syncbn/elementwise_cuda.cu"]
