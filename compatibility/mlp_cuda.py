"""mlp_cuda: NVIDIA apex's fused MLP module (forward, backward), a face of the fused_dense ops."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__, library="fused_dense", prefix="mlp_")
