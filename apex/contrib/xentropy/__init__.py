"""Softmax cross entropy with label smoothing, one pass over the logits forward and one backward."""
from .softmax_xentropy import SoftmaxCrossEntropyLoss, softmax_cross_entropy

__all__ = ["SoftmaxCrossEntropyLoss", "softmax_cross_entropy"]
