"""apex.fused_dense: fused linear (+ bias) and linear + GELU + linear layers (see fused_dense.py)."""
from .fused_dense import *  # noqa: F401,F403
from .fused_dense import __all__  # noqa: F401
