"""generic_scaled_masked_softmax_cuda: Megatron's any-length scaled masked softmax module (forward(input, mask, scale), backward), served by the fused_softmax ops."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__, library="fused_softmax", prefix="generic_scaled_masked_softmax_")
