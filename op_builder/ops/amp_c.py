from ..builder import CUDAOpBuilder


class AmpCBuilder(CUDAOpBuilder):
    """Multi-tensor kernels: fused Adam/LAMB/SGD/LARS/NovoGrad/Adagrad/RMSprop/Adadelta/AdamP steps, amp unscale, grad L2 norms."""

    NAME = "amp_C"
    SOURCE_DIR = "multi_tensor"
    # amp_C's functions are named as their ops (torch.ops.apex.multi_tensor_adam is amp_C.multi_tensor_adam).
    FACE_PREFIX = ""
    # The few historical functions whose name or return value differ from their op's.
    FACE_MODULE = "apex.multi_tensor_apply.amp_C_faces"
