"""RNN-T (transducer) joint and loss: NVIDIA apex's TransducerJoint and TransducerLoss."""
from . import _transducer_ref
from .transducer import TransducerJoint, TransducerLoss

__all__ = ["TransducerJoint", "TransducerLoss"]
