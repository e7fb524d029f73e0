"""apex_C: flatten/unflatten of tensor lists (torch.ops.apex.apex_C_*; compiled on first attribute access)."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__)
