from ..builder import CUDAOpBuilder


class FusedLayerNormBuilder(CUDAOpBuilder):
    """Fused LayerNorm / RMSNorm forward and backward (apex.normalization), CPU and CUDA."""

    NAME = "fused_layer_norm_cuda"
    SOURCE_DIR = "layer_norm"
    # NVIDIA apex's functions (forward_affine, rms_backward, ...) take other arguments than the ops.
    FACE_MODULE = "apex.normalization._fused_layer_norm_cuda"
