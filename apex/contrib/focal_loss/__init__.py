"""Sigmoid focal loss (RetinaNet) in one pass over the logits each way.

As in NVIDIA apex, ``apex.contrib.focal_loss.focal_loss`` is the module: call
``focal_loss.focal_loss(...)`` or ``focal_loss.FocalLoss.apply(...)``.
"""
from . import focal_loss

__all__ = ["focal_loss"]
