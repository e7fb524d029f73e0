"""fused_rotary_positional_embedding: Megatron's fused RoPE module (forward/backward, _cached, _thd, _2d), compiled on first attribute access."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__)
