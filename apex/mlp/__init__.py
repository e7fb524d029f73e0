"""apex.mlp: a fused multi-layer perceptron (see mlp.py)."""
from .mlp import *  # noqa: F401,F403
from .mlp import __all__  # noqa: F401
