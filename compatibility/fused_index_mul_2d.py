"""fused_index_mul_2d: NVIDIA apex's index_mul_2d module (float_/half_ forward, backward, backward_backward), compiled on first attribute access."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__)
