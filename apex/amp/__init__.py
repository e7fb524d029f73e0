"""apex.amp: automatic mixed precision (opt levels O0-O5), dynamic loss scaling, checkpoints.

    model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
"""
from ._amp_state import master_params
from .frontend import initialize, load_state_dict, state_dict
from .function_casts import (
    bfloat16_function,
    disable_casts,
    float_function,
    half_function,
    promote_function,
    register_bfloat16_function,
    register_float_function,
    register_half_function,
    register_promote_function,
)
from .handle import scale_loss
from .scaler import LossScaler

__all__ = [
    "initialize", "scale_loss", "state_dict", "load_state_dict", "master_params", "disable_casts",
    "half_function", "bfloat16_function", "float_function", "promote_function",
    "register_half_function", "register_bfloat16_function", "register_float_function",
    "register_promote_function", "LossScaler",
]
