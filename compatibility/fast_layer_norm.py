"""fast_layer_norm: NVIDIA apex contrib's ln_fwd / ln_bwd, served by the fused_layer_norm_cuda kernels."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__, library="fused_layer_norm_cuda", adapters="apex.contrib.layer_norm._fast_layer_norm")
