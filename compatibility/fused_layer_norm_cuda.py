"""fused_layer_norm_cuda: fused LayerNorm/RMSNorm forward and backward (CPU and CUDA). Compiled on first attribute access (see op_builder)."""
from op_builder.lazy import lazy_module_getattr
__getattr__, __dir__ = lazy_module_getattr(__name__)
