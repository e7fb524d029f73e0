"""fused_layer_norm_cuda: NVIDIA apex's fused LayerNorm/RMSNorm functions (CPU and CUDA; compiled on first attribute access)."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__)
