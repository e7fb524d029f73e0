from op_builder.builder import CUDAOpBuilder


class FusedLayerNormBuilder(CUDAOpBuilder):
    """Fused LayerNorm / RMSNorm forward and backward (apex.normalization), CPU and CUDA."""

    NAME = "fused_layer_norm_cuda"
    CPP_SOURCES = ["layer_norm/binding.cpp", "layer_norm/layer_norm_ops.cpp", "layer_norm/layer_norm_cpu.cpp"]
    # Forward and backward kernels live in separate files so that ninja compiles them in parallel.
    CUDA_SOURCES = ["layer_norm/layer_norm_forward.cu", "layer_norm/layer_norm_backward.cu",
                    "layer_norm/layer_norm_cuda.cu"]
