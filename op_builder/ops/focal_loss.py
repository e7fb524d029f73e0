from ..builder import CUDAOpBuilder


class FocalLossBuilder(CUDAOpBuilder):
    """Sigmoid focal loss of detection heads (apex.contrib.focal_loss): one pass forward, one backward."""

    NAME = "focal_loss_cuda"
    SOURCE_DIR = "focal_loss"
    FACE_PREFIX = "focal_loss_"
    FACE_MODULE = "apex.contrib.focal_loss._historical"
