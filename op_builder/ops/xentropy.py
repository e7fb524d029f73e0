from ..builder import CUDAOpBuilder


class XentropyBuilder(CUDAOpBuilder):
    """Softmax cross entropy with label smoothing (apex.contrib.xentropy): one pass over the logits each way."""

    NAME = "xentropy_cuda"
    SOURCE_DIR = "xentropy"
    FACE_PREFIX = "xentropy_"
