"""syncbn: Welford statistics and batch-norm kernels for SyncBatchNorm (torch.ops.apex.syncbn_*; compiled on first attribute access)."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__)
