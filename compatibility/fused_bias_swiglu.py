"""fused_bias_swiglu: ROCm apex's bias-SwiGLU module (forward(x, bias), backward(grad, x, bias)), compiled on first attribute access."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__)
