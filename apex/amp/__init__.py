"""apex.amp: automatic mixed precision (opt levels O0-O5), dynamic loss scaling, checkpoints.

    model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()

The legacy API is here too: `handle = amp.init()` installs the O1 casts process-wide (see
apex.amp.lists), `amp.half_function` & co. and `amp.register_*_function` add casts around the
user's functions, and `amp._amp_state` holds the fields scripts read and set
(`loss_scalers`, `opt_properties`, `handle`, `hard_override`, `allow_incoming_model_not_fp32`).
"""
from ._amp_state import _amp_state, master_params
from .amp import (
    bfloat16_function,
    float_function,
    half_function,
    init,
    promote_function,
    register_bfloat16_function,
    register_float_function,
    register_half_function,
    register_promote_function,
)
from .frontend import initialize, load_state_dict, state_dict
from .handle import disable_casts, scale_loss
from .scaler import LossScaler

__all__ = [
    "initialize", "scale_loss", "state_dict", "load_state_dict", "master_params", "disable_casts", "init",
    "half_function", "bfloat16_function", "float_function", "promote_function",
    "register_half_function", "register_bfloat16_function", "register_float_function",
    "register_promote_function", "LossScaler",
]
