"""xentropy_cuda: NVIDIA apex's softmax cross entropy module (forward, backward), compiled on first attribute access."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__)
