"""Checking and processing the models and optimizers given to `amp.initialize`."""
import torch
from torch.utils.weak import WeakIdKeyDictionary

from ._amp_state import _amp_state, warn_or_err
from ._process_optimizer import process_optimizer
from .function_casts import apply_registrations
from .model_casting import AmpForward, convert_network, keep_state_dict_fp32, model_device_type
from .properties import LOW_PRECISION_TYPES
from .scaler import LossScaler


def _as_list(value, kind, message, allow_none=False):
    """(list, was_list): apex accepts one object or a list of them, and answers in the same shape."""
    if allow_none and value is None:
        return [], False
    if isinstance(value, kind):
        return [value], False
    if isinstance(value, list) and all(isinstance(v, kind) for v in value):
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
        for name, param in model.named_parameters():
            if param.is_floating_point() and param.dtype != torch.float32:
                warn_or_err(f"Found param {name} with type {param.type()}, expected a float32 param.\n"
                            "When using amp.initialize, you do not need to call .half() on your model\n"
                            "before passing it, no matter what optimization level you choose.")


def _check_optimizers(optimizers):
    for optimizer in optimizers:
        if hasattr(optimizer, "_amp_stash"):
            raise RuntimeError("A given optimizer should only be passed through amp.initialize once.")


def _wrap_forward(model, properties, cast_model_outputs):
    low_precision_model = properties.cast_model_type in LOW_PRECISION_TYPES
    function_casting = properties.patch_torch_functions and properties.patch_torch_functions_type
    if not (low_precision_model or function_casting or cast_model_outputs is not None):
        return
    # Outputs leave in fp32 by default: the loss is computed outside the model (and outside
    # the O1/O4 autocast region), where apex's patched loss functions ran in fp32 too.
    output_type = cast_model_outputs
    if output_type is None and (low_precision_model or function_casting):
        output_type = torch.float32
    model.forward = AmpForward(
        model.forward,
        input_type=properties.cast_model_type if low_precision_model else None,
        output_type=output_type,
        autocast_device=model_device_type(model) if function_casting else None,
        autocast_type=properties.patch_torch_functions_type if function_casting else None,
    )


def initialize_models_and_optimizers(models, optimizers, properties, num_losses, cast_model_outputs,
                                     combine_grad, scaler_options):
    """Cast and wrap the models, turn the optimizers into amp optimizers, create the loss scalers.
    Returns models and optimizers in the shape they were given."""
    optimizers, optimizers_was_list = _as_list(
        optimizers, torch.optim.Optimizer,
        "optimizers must be either a single optimizer or a list of optimizers.", allow_none=True)
    models, models_was_list = _as_list(
        models, torch.nn.Module, "models must be either a single model or a list of models.")
    # Everything is checked before anything is changed, so a refused call leaves no half-cast model.
    _check_optimizers(optimizers)
    _check_models(models)

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
        process_optimizer(optimizer, properties, combine_grad, fp32_originals)

    _amp_state.loss_scalers = [LossScaler(properties.loss_scale, **scaler_options) for _ in range(num_losses)]
    if properties.patch_torch_functions:
        apply_registrations()

    returned_models = models if models_was_list else models[0]
    if not optimizers and not optimizers_was_list:
        return returned_models
    return returned_models, (optimizers if optimizers_was_list else optimizers[0])
