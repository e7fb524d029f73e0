"""Checking and processing the models and optimizers given to `amp.initialize`."""
import torch
from torch.utils.weak import WeakIdKeyDictionary

from ._amp_state import _amp_state, maybe_print, warn_or_err
from ._process_optimizer import is_optimizer, process_optimizer
from .amp import init as install_casts
from .casting_handle import NoOpHandle
from .grads import FlatOptions
from .model_casting import AmpForward, convert_network, keep_state_dict_fp32
from .properties import LOW_PRECISION_TYPES
from .scaler import LossScaler


def _as_list(value, is_kind, message, allow_none=False):
    """(list, was_list): apex accepts one object or a list of them, and answers in the same shape."""
    if allow_none and value is None:
        return [], False
    if is_kind(value):
        return [value], False
    if isinstance(value, list) and all(is_kind(v) for v in value):
        return list(value), True
    raise TypeError(message)


def _check_models(models):
    for model in models:
        parallel_type = None
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            parallel_type = "torch.nn.parallel.DistributedDataParallel"
        elif isinstance(model, torch.nn.DataParallel):
            parallel_type = "torch.nn.parallel.DataParallel"
        elif type(model).__name__ == "DistributedDataParallel":
            parallel_type = f"{type(model).__module__}.DistributedDataParallel"
        if parallel_type is not None:
            raise RuntimeError(f"Incoming model is an instance of {parallel_type}. "
                               "Parallel wrappers should only be applied to the model(s) AFTER \n"
                               "the model(s) have been returned from amp.initialize.")
        if getattr(model, "_amp_initialized", False):
            raise RuntimeError("A given model should only be passed through amp.initialize once.")
        if _amp_state.allow_incoming_model_not_fp32:
            continue
        for name, param in model.named_parameters():
            if param.is_floating_point() and param.dtype != torch.float32:
                warn_or_err(f"Found param {name} with type {param.type()}, expected a float32 param.\n"
                            "When using amp.initialize, you do not need to call .half() or .bfloat16() on your\n"
                            "model before passing it, no matter what optimization level you choose.")


def _check_optimizers(optimizers):
    for optimizer in optimizers:
        if hasattr(optimizer, "_amp_stash"):
            raise RuntimeError("A given optimizer should only be passed through amp.initialize once.")


def _refuse_fp16_optimizer(optimizers):
    from apex.fp16_utils import FP16_Optimizer  # imported here: apex.fp16_utils builds on apex.amp

    if any(isinstance(optimizer, FP16_Optimizer) for optimizer in
           (optimizers if isinstance(optimizers, list) else [optimizers])):
        raise RuntimeError("An incoming optimizer is an instance of apex.fp16_utils.FP16_Optimizer. "
                           "The optimizer(s) passed to amp.initialize() must be bare \n"
                           "instances of either ordinary Pytorch optimizers, or Apex fused \n"
                           "optimizers.\n")


def _wrap_forward(model, properties, cast_model_outputs):
    """O2/O3/O5: floating inputs enter in the model's type and outputs leave in fp32 (or
    `cast_model_outputs`); other levels only cast outputs, and only when asked to."""
    low_precision_model = properties.cast_model_type in LOW_PRECISION_TYPES
    if low_precision_model:
        output_type = torch.float32 if cast_model_outputs is None else cast_model_outputs
        model.forward = AmpForward(model.forward, input_type=properties.cast_model_type, output_type=output_type)
    elif cast_model_outputs is not None:
        model.forward = AmpForward(model.forward, output_type=cast_model_outputs)


def _flat_options(models, properties):
    """The combine_grad layouts' options; with combine_ddp, every rank starts from rank 0's weights
    (before any cast, so O2/O5 masters agree too) and a reducer averages the grads."""
    if not properties.combine_grad:
        if properties.check_combined_tensors:
            maybe_print("check_combined_tensors=True has no effect without combine_grad=True.", True)
        return None
    reducer = None
    if properties.combine_ddp:
        from . import grad_reducer  # imports torch.distributed, needed only here

        grad_reducer.broadcast_from_rank0(models)
        replica_count = properties.ddp_replica_count

        def reducer(buffers, layouts, params):
            return grad_reducer.FlatGradReducer(buffers, layouts, params, replica_count)
    return FlatOptions(reducer=reducer, check_layout=bool(properties.check_combined_tensors))


def initialize_models_and_optimizers(models, optimizers, properties, num_losses, cast_model_outputs,
                                     scaler_options):
    """Cast and wrap the models, turn the optimizers into amp optimizers, create the loss scalers.
    Returns models and optimizers in the shape they were given."""
    _refuse_fp16_optimizer(optimizers)
    optimizers, optimizers_was_list = _as_list(
        optimizers, is_optimizer,
        "optimizers must be either a single optimizer or a list of optimizers.", allow_none=True)
    models, models_was_list = _as_list(models, lambda model: isinstance(model, torch.nn.Module),
                                       "models must be either a single model or a list of models.")
    # Everything is checked before anything is changed, so a refused call leaves no half-cast model.
    _check_optimizers(optimizers)
    _check_models(models)

    flat_options = _flat_options(models, properties)
    fp32_originals = WeakIdKeyDictionary()
    if properties.cast_model_type:
        if properties.master_weights and properties.cast_model_type in LOW_PRECISION_TYPES:
            for model in models:
                for param in model.parameters():
                    fp32_originals[param] = param.detach().clone()
        for model in models:
            convert_network(model, properties.cast_model_type, properties.keep_batchnorm_fp32)
        if not properties.master_weights:
            # Recast per-param state an optimizer may already hold to the params' new type
            # (with master weights it moves, still fp32, to the masters instead).
            for optimizer in optimizers:
                optimizer.load_state_dict(optimizer.state_dict())
    for model in models:
        _wrap_forward(model, properties, cast_model_outputs)
        if properties.cast_model_type in LOW_PRECISION_TYPES:
            keep_state_dict_fp32(model)
        model._amp_initialized = True

    for optimizer in optimizers:
        process_optimizer(optimizer, properties, fp32_originals, flat_options)

    _amp_state.loss_scalers = [LossScaler(properties.loss_scale, **scaler_options) for _ in range(num_losses)]
    if properties.patch_torch_functions:
        # O1/O4: the cast lists, as amp.init() installs them (replacing any earlier casts).
        install_casts(loss_scale=properties.loss_scale, patch_type=properties.patch_torch_functions_type,
                      verbose=_amp_state.verbosity == 2, user_cast_preferred=properties.user_cast_preferred)
    else:
        _amp_state.handle._deactivate()
        _amp_state.handle = NoOpHandle()

    returned_models = models if models_was_list else models[0]
    if not optimizers and not optimizers_was_list:
        return returned_models
    return returned_models, (optimizers if optimizers_was_list else optimizers[0])
