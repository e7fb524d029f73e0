"""fused_dense_cuda: NVIDIA apex's fused dense module (linear_bias_*, linear_gelu_linear_*), a face of the fused_dense ops."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__, library="fused_dense", prefix="fused_dense_")
