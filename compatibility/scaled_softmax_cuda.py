"""scaled_softmax_cuda: Megatron's scaled softmax module (forward(input, scale), backward), served by the fused_softmax ops."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__, library="fused_softmax", prefix="scaled_softmax_")
