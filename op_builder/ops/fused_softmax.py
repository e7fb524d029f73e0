from ..builder import CUDAOpBuilder


class FusedSoftmaxBuilder(CUDAOpBuilder):
    """Scaled (masked / causal) softmax forward and backward, any key length; serves the four scaled_*softmax_cuda modules."""

    NAME = "fused_softmax"
