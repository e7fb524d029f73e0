"""`amp.initialize`, `amp.state_dict`, `amp.load_state_dict`."""
from collections import OrderedDict

import torch

from ._amp_state import _amp_state, maybe_print
from ._initialize import initialize_models_and_optimizers
from .properties import OPT_LEVELS, Properties


def _check_scaler_options(num_losses, min_loss_scale, max_loss_scale, dynamic_init_scale,
                          scale_growth_factor, scale_backoff_factor, scale_window):
    if not (isinstance(num_losses, int) and num_losses >= 1):
        raise ValueError(f"num_losses must be a positive integer, found num_losses={num_losses!r}")
    if min_loss_scale is not None and not 0 < min_loss_scale <= max_loss_scale:
        raise ValueError(f"min_loss_scale must lie in (0, max_loss_scale={max_loss_scale}], "
                         f"found min_loss_scale={min_loss_scale}")
    if not max_loss_scale > 0 or not dynamic_init_scale > 0:
        raise ValueError("max_loss_scale and dynamic_init_scale must be positive, found "
                         f"max_loss_scale={max_loss_scale}, dynamic_init_scale={dynamic_init_scale}")
    if not scale_growth_factor > 1 or not 0 < scale_backoff_factor < 1:
        raise ValueError("scale_growth_factor must exceed 1 and scale_backoff_factor lie in (0, 1), found "
                         f"{scale_growth_factor} and {scale_backoff_factor}")
    if not (isinstance(scale_window, int) and scale_window >= 1):
        raise ValueError(f"scale_window must be a positive integer, found scale_window={scale_window!r}")


def initialize(models, optimizers=None, enabled=True, opt_level="O1", cast_model_type=None,
               patch_torch_functions=None, patch_torch_functions_type=None, keep_batchnorm_fp32=None,
               master_weights=None, loss_scale=None, cast_model_outputs=None, num_losses=1, verbosity=1,
               min_loss_scale=None, max_loss_scale=2.**24, dynamic_init_scale=2.**16, scale_growth_factor=2.,
               scale_backoff_factor=0.5, scale_window=2000, combine_grad=None, combine_ddp=None,
               ddp_replica_count=4, user_cast_preferred=None, check_combined_tensors=None):
    """Prepare models and optimizers for mixed-precision training at `opt_level`.

    O0 fp32 | O1 fp16 casts around torch functions (amp.init's cast lists, process-wide until
    `amp._amp_state.handle._deactivate()`) | O2 fp16 model, fp32 batchnorm and fp32 master weights |
    O3 pure fp16 | O4/O5: O1/O2 in bfloat16 (no loss scaling). Any property
    (cast_model_type, patch_torch_functions[_type], keep_batchnorm_fp32, master_weights,
    loss_scale: a number or "dynamic") may be overridden; conflicting overrides raise.

    models: an nn.Module or a list of them, with float32 params (CPU or CUDA; fp16/bf16 params
        are refused unless `amp._amp_state.allow_incoming_model_not_fp32` is set).
    optimizers: None, a torch.optim.Optimizer (apex fused ones and apex.parallel.LARC included)
        or a list of them.
    cast_model_outputs: dtype the models' floating outputs are cast to (default float32 when the
        model computes in low precision).
    num_losses: how many independent loss scalers `scale_loss(..., loss_id=i)` may use.
    combine_grad: keep each optimizer's grads as views into one flat buffer per dtype, so every
        unscale is a single kernel (all params then always have a grad, zero when unused).
    combine_ddp: with combine_grad, average those flat buffers over the torch.distributed ranks
        after every backward, in place of a DistributedDataParallel wrapper (which must then not
        be used): the params are broadcast from rank 0 here, and each buffer is all-reduced in up
        to `ddp_replica_count` chunks, each starting as soon as the backward has produced its
        grads. Needs `torch.distributed.init_process_group()` first.
    ddp_replica_count: how many chunks combine_ddp cuts each buffer into (default 4): more
        overlap with the backward, but more, smaller all-reduces.
    user_cast_preferred: at O1/O4, a function registered with `amp.register_*_function` gets only
        the user's cast, not also the cast lists' (no redundant double cast).
    check_combined_tensors: with combine_grad, check before every use that the params still fit
        their flat buffers (shape, dtype, device); when not, print a notice and rebuild the buffers.

    Returns the models and optimizers in the shape they were given:
    `model, optimizer = amp.initialize(model, optimizer, opt_level="O2")`.
    """
    _amp_state.verbosity = verbosity
    if not enabled:
        _amp_state.opt_properties = Properties()  # disabled: scale_loss hands the loss back untouched
        return models if optimizers is None else (models, optimizers)
    if opt_level not in OPT_LEVELS:
        raise RuntimeError(f"Unexpected optimization level {opt_level}. Options are "
                           f"{', '.join(repr(name) for name in OPT_LEVELS)}.  Note that in `O0`, `O1`, etc., "
                           "the prefix O is the letter O, not the number zero.")
    _check_scaler_options(num_losses, min_loss_scale, max_loss_scale, dynamic_init_scale,
                          scale_growth_factor, scale_backoff_factor, scale_window)

    properties = Properties()
    properties.apply_opt_level(opt_level)
    maybe_print(f"Selected optimization level {OPT_LEVELS[opt_level].brief}", True)
    maybe_print("Defaults for this optimization level are:", True)
    for name, value in properties.options.items():
        maybe_print(f"{name:26} : {value}", True)

    maybe_print("Processing user overrides (additional kwargs that are not None)...", True)
    overrides = dict(cast_model_type=cast_model_type, patch_torch_functions=patch_torch_functions,
                     patch_torch_functions_type=patch_torch_functions_type,
                     keep_batchnorm_fp32=keep_batchnorm_fp32, master_weights=master_weights,
                     loss_scale=loss_scale, combine_grad=combine_grad, combine_ddp=combine_ddp,
                     ddp_replica_count=ddp_replica_count, user_cast_preferred=user_cast_preferred,
                     check_combined_tensors=check_combined_tensors)
    for name, value in overrides.items():
        if value is not None:
            setattr(properties, name, value)
    if properties.patch_torch_functions and properties.patch_torch_functions_type is None:
        properties.patch_torch_functions_type = torch.float16
    maybe_print("After processing overrides, optimization options are:", True)
    for name, value in properties.options.items():
        maybe_print(f"{name:26} : {value}", True)

    _amp_state.min_loss_scale, _amp_state.max_loss_scale = min_loss_scale, max_loss_scale
    scaler_options = dict(init_scale=dynamic_init_scale, growth_factor=scale_growth_factor,
                          backoff_factor=scale_backoff_factor, scale_window=scale_window,
                          min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale)
    result = initialize_models_and_optimizers(models, optimizers, properties, num_losses, cast_model_outputs,
                                              scaler_options)
    # Published last: a refused call leaves the previous state in place for scale_loss.
    _amp_state.opt_properties = properties
    return result


def state_dict(destination=None):
    """The loss scalers' state: {'loss_scaler<i>': {'loss_scale': float, 'unskipped': int}}."""
    if destination is None:
        destination = OrderedDict()
    for idx, loss_scaler in enumerate(_amp_state.loss_scalers):
        destination[f"loss_scaler{idx}"] = loss_scaler.state_dict()
    return destination


def load_state_dict(state_dict):
    """Restore the loss scalers saved by `amp.state_dict()`; call it after amp.initialize."""
    nb_loss_scalers = len(_amp_state.loss_scalers)
    if len(state_dict) != nb_loss_scalers:
        print(f"Warning: state_dict contains {len(state_dict)} entries, while {nb_loss_scalers} "
              "loss_scalers are used")
    unexpected_keys = [key for key in state_dict if "loss_scaler" not in key]
    if unexpected_keys:
        raise RuntimeError("Error(s) in loading state_dict. Unexpected key(s) in state_dict: {}. ".format(
            ", ".join(f'"{key}"' for key in unexpected_keys)))
    scaler_states = [value for key, value in state_dict.items() if "loss_scaler" in key]
    for idx, scaler_state in enumerate(scaler_states):
        if idx >= nb_loss_scalers:
            print(f"Skipping loss_scaler[{idx}], since num_losses was set to {nb_loss_scalers}")
            break
        _amp_state.loss_scalers[idx].load_state_dict(scaler_state)
