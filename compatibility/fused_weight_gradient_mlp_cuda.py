"""fused_weight_gradient_mlp_cuda: Megatron's weight-gradient accumulation (wgrad_gemm_accum_fp32/_fp16), a face of the fused_dense ops."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__, library="fused_dense", prefix="fused_weight_gradient_mlp_")
