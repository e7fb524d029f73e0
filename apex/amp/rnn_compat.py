"""amp's casts for recurrent layers.

nn.RNN/LSTM/GRU and nn.RNNCell/LSTMCell/GRUCell call `torch._VF` functions through the name
`_VF` of `torch.nn.modules.rnn`. While casts are installed, that name is a shim whose RNN
functions run in fp16/bf16 (every other attribute is the real `torch._VF`'s), so torch._VF itself,
and anyone else calling it, is left alone.
"""
import functools

import torch

from .wrap import CASTABLE, cast_wrapper, caster

RNN_NAMES = ("rnn_relu", "rnn_tanh", "gru", "lstm")


class VariableFunctionsShim:
    """Stands in for `torch._VF` inside torch.nn.modules.rnn."""

    def __init__(self, variable_functions):
        self._variable_functions = variable_functions

    def __getattr__(self, name):
        return getattr(self._variable_functions, name)


def low_precision_weights(weights, dtype):
    """`weights` (a layer's weight list) cast to `dtype`, differentiably.

    Weights flattened into one buffer (what cuDNN wants, and what `flatten_parameters()` makes)
    are cast into one `dtype` buffer with the very same layout, so cuDNN finds them contiguous
    instead of copying them into a fresh buffer on every call."""
    if all(weight.dtype is dtype or weight.dtype not in CASTABLE for weight in weights):
        return weights
    first = weights[0]
    storage = first.untyped_storage()
    if any(weight.dtype is not first.dtype or weight.untyped_storage().data_ptr() != storage.data_ptr()
           for weight in weights):
        return [weight.to(dtype) if weight.dtype in CASTABLE else weight for weight in weights]
    buffer = first.new_empty(storage.nbytes() // first.element_size(), dtype=dtype)
    cast = []
    for weight in weights:
        # A fresh tensor over the buffer's storage, not an autograd view of `buffer`: each copy_
        # then records its own CopyBackwards to its fp32 weight.
        view = buffer.new_empty(0).set_(buffer.untyped_storage(), weight.storage_offset(), weight.size(),
                                        weight.stride())
        cast.append(view.copy_(weight))
    return cast


def rnn_wrapper(fn, dtype, handle, name):
    """A casting stand-in for `torch._VF.<lstm|gru|rnn_tanh|rnn_relu>`, called by nn.RNNBase as
    (input, hx, weights, ...) or, for a PackedSequence, (data, batch_sizes, hx, weights, ...)."""
    cast = caster(dtype, handle, name)

    @functools.wraps(fn)
    def wrapper(*args):
        if not handle._is_active:
            return fn(*args)
        packed = isinstance(args[1], torch.Tensor) and not args[1].is_floating_point()  # batch_sizes
        weights_at = 3 if packed else 2
        return fn(*[low_precision_weights(arg, dtype) if i == weights_at else cast(arg)
                    for i, arg in enumerate(args)])

    return wrapper


def check_input_wrapper(check_input, handle):
    """nn.RNNBase.check_input refuses an input whose dtype differs from the weights' unless
    torch.autocast is on; amp casts both to one type itself, so while it is active the check is
    shown a stand-in of the input's shape in the weights' dtype (on the meta device: no memory)."""

    @functools.wraps(check_input)
    def wrapper(self, input, batch_sizes):
        weight = self._flat_weights[0]
        if handle._is_active and input.dtype in CASTABLE and weight is not None and input.dtype != weight.dtype:
            input = torch.empty((), dtype=weight.dtype, device="meta").expand(input.shape)
        return check_input(self, input, batch_sizes)

    return wrapper


def install_rnn_casts(handle, dtype):
    """Run RNNs and RNN cells in `dtype` while `handle` is active (the cells' weights cast once
    per iteration through the handle's cache, however many time steps use them)."""
    rnn_module = torch.nn.modules.rnn
    variable_functions = rnn_module._VF
    shim = VariableFunctionsShim(variable_functions)
    for name in RNN_NAMES:
        setattr(shim, name, rnn_wrapper(getattr(variable_functions, name), dtype, handle, name))
        cell = name + "_cell"
        setattr(shim, cell, cast_wrapper(getattr(variable_functions, cell), dtype, handle, cell, try_caching=True))
    handle._patch(rnn_module, "_VF", lambda _: shim)
    handle._patch(rnn_module.RNNBase, "check_input", functools.partial(check_input_wrapper, handle=handle))
