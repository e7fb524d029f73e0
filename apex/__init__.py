"""apex: fused kernels and mixed-precision training for PyTorch, with NVIDIA/ROCm apex's API.

    import apex
    optimizer = apex.optimizers.FusedAdam(model.parameters(), lr=1e-3)
    model, optimizer = apex.amp.initialize(model, optimizer, opt_level="O2")

Every subpackage (``amp``, ``optimizers``, ``normalization``, ``parallel``, ``fp16_utils``,
``multi_tensor_apply``, ``transformer``, ``mlp``, ``fused_dense``, ``contrib``, ``testing``,
``distributed_testing``, ``op_builder``) is an attribute of ``apex``, imported on first access.
``import apex`` itself imports neither torch nor any subpackage and compiles nothing, so it costs
about a millisecond; ops compile the first time they are used.
"""
import os
import warnings

# NVIDIA apex and ROCm apex import these eagerly; here each is imported when first touched.
_SUBPACKAGES = (
    "amp", "contrib", "distributed_testing", "fp16_utils", "fused_dense", "mlp", "multi_tensor_apply",
    "normalization", "op_builder", "optimizers", "parallel", "testing", "transformer",
)


def _is_present(name):
    """Whether subpackage `name` is in this installation (checked on disk; nothing is imported)."""
    return any(os.path.exists(os.path.join(folder, name)) or os.path.exists(os.path.join(folder, name + ".py"))
               for folder in __path__)


def __getattr__(name):
    if name in _SUBPACKAGES:
        import importlib  # here, not at the top: `import apex` itself stays a few file reads

        try:
            # importlib also binds the module as an attribute here, so this runs once per name.
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise  # the subpackage exists but something it imports does not
            raise AttributeError(f"module 'apex' has no attribute '{name}': apex.{name} is not part of "
                                 "this installation") from error
    if name == "IS_ROCM_PYTORCH":
        return check_if_rocm_pytorch()
    raise AttributeError(f"module 'apex' has no attribute '{name}'")


def __dir__():
    return sorted(set(globals()) | set(_SUBPACKAGES) | {"IS_ROCM_PYTORCH"})


def check_if_rocm_pytorch():
    """True when the installed torch is a ROCm (HIP) build (ROCm apex's `apex.IS_ROCM_PYTORCH`)."""
    import torch

    return getattr(torch.version, "hip", None) is not None


def check_cudnn_version_and_warn(global_option: str, required_cudnn_version: int) -> bool:
    """Whether cuDNN >= `required_cudnn_version` is available; warns naming `global_option` when not.
    Always True on ROCm, which has no cuDNN (as in ROCm apex)."""
    import torch

    if check_if_rocm_pytorch():
        return True
    cudnn_version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if cudnn_version is None or cudnn_version < required_cudnn_version:
        warnings.warn(f"`{global_option}` depends on cuDNN {required_cudnn_version} or later, but "
                      f"{'cuDNN is not available' if cudnn_version is None else cudnn_version}")
        return False
    return True


class DeprecatedFeatureWarning(FutureWarning):
    """Category of the warnings apex gives for features slated for removal."""


def deprecated_warning(msg: str) -> None:
    """Warn with `msg` (DeprecatedFeatureWarning), on rank 0 only when torch.distributed is running."""
    import torch

    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if not distributed or torch.distributed.get_rank() == 0:
        warnings.warn(msg, DeprecatedFeatureWarning)


__all__ = [name for name in _SUBPACKAGES if _is_present(name)] + [
    "check_if_rocm_pytorch", "check_cudnn_version_and_warn", "DeprecatedFeatureWarning", "deprecated_warning",
]
