"""focal_loss_cuda: NVIDIA apex's focal loss module (forward, backward), compiled on first attribute access."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__)
