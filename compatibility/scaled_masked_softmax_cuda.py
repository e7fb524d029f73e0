"""scaled_masked_softmax_cuda: Megatron's scaled masked softmax module (forward(input, mask, scale), backward, get_batch_per_block), served by the fused_softmax ops."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__, library="fused_softmax", prefix="scaled_masked_softmax_",
                                   adapters="apex.transformer.functional._softmax_faces")
