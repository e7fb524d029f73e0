"""The opt levels O0-O5 and the validated per-run properties they set (apex's frontend rules)."""
from dataclasses import dataclass, field

import torch

from ._amp_state import warn_or_err


@dataclass(frozen=True)
class OptLevel:
    """Defaults one opt level gives every property (the user may override each)."""

    brief: str
    cast_model_type: object
    patch_torch_functions: bool
    patch_torch_functions_type: object
    keep_batchnorm_fp32: object
    master_weights: object
    loss_scale: object
    # The level a model cast would need, named in the error that O1/O4 give for a model cast.
    model_cast_level: str = field(default="O2", compare=False)


OPT_LEVELS = {
    "O0": OptLevel("O0:  Pure FP32 training.", torch.float32, False, None, None, False, 1.0),
    "O1": OptLevel("O1:  Insert automatic casts around Pytorch functions and Tensor methods.",
                   None, True, torch.float16, None, None, "dynamic"),
    "O2": OptLevel("O2:  FP16 training with FP32 batchnorm and FP32 master weights.",
                   torch.float16, False, None, True, True, "dynamic"),
    "O3": OptLevel("O3:  Pure FP16 training.", torch.float16, False, None, False, False, 1.0),
    # bf16 has fp32's exponent range, so the bf16 levels need no loss scaling (as in ROCm apex).
    "O4": OptLevel("O4:  Insert automatic casts around Pytorch functions and Tensor methods. "
                   "Cast to BFLOAT16.", None, True, torch.bfloat16, None, None, 1.0, "O5"),
    "O5": OptLevel("O5:  BFLOAT16 training with FP32 batchnorm and FP32 master weights.",
                   torch.bfloat16, False, None, True, True, 1.0),
}

# Levels whose casting happens around functions (amp's cast lists), not on the model's weights.
FUNCTION_CASTING_LEVELS = ("O1", "O4")
LOW_PRECISION_TYPES = (torch.float16, torch.bfloat16)


class Properties:
    """The options of one amp run. Setting an option checks it against the opt level first."""

    def __init__(self):
        self.__dict__["options"] = {
            "enabled": False,
            "opt_level": None,
            "cast_model_type": None,
            "patch_torch_functions": False,
            "patch_torch_functions_type": None,
            "keep_batchnorm_fp32": None,
            "master_weights": None,
            "loss_scale": 1.0,
            # Ascend apex's knobs (checked below): flat grad buffers, data-parallel averaging of
            # them, the user's registrations before the cast lists, layout checks of the buffers.
            "combine_grad": None,
            "combine_ddp": None,
            "ddp_replica_count": 4,
            "user_cast_preferred": None,
            "check_combined_tensors": None,
        }

    def apply_opt_level(self, name):
        level = OPT_LEVELS[name]
        self.options.update(enabled=True, opt_level=name, cast_model_type=level.cast_model_type,
                            patch_torch_functions=level.patch_torch_functions,
                            patch_torch_functions_type=level.patch_torch_functions_type,
                            keep_batchnorm_fp32=level.keep_batchnorm_fp32,
                            master_weights=level.master_weights, loss_scale=level.loss_scale)

    def __getattr__(self, name):
        options = self.__dict__["options"]
        if name in options:
            return options[name]
        raise AttributeError(f"'Properties' object has no attribute '{name}'")

    def __setattr__(self, name, value):
        if name not in self.options:
            raise AttributeError(f"'{name}' is not an amp property; properties are {list(self.options)}")
        check = getattr(self, f"_checked_{name}", None)
        self.options[name] = check(value) if check else value

    @property
    def casts_functions(self):
        return self.opt_level in FUNCTION_CASTING_LEVELS

    def _checked_cast_model_type(self, value):
        if self.casts_functions and value not in (None, False, torch.float32):
            level = self.opt_level
            warn_or_err(f"{level} inserts casts around Torch functions rather than "
                        f"model weights, so with {level}, the model weights themselves "
                        "should remain FP32. If you wish to cast the model to a "
                        f"different type, use opt_level='{OPT_LEVELS[level].model_cast_level}' or 'O3'. "
                        f"cast_model_type was {value}")
        if value not in (None, False) and not (isinstance(value, torch.dtype) and value.is_floating_point):
            raise ValueError(f"cast_model_type must be a floating-point torch.dtype, None or False, "
                             f"found cast_model_type={value}")
        return value

    def _checked_patch_torch_functions(self, value):
        if not self.casts_functions and value:
            warn_or_err("Currently, patch_torch_functions=True should only be set by "
                        "selecting opt_level='O1' (or 'O4' for bfloat16).")
        return value

    def _checked_patch_torch_functions_type(self, value):
        if value is not None and value not in LOW_PRECISION_TYPES:
            raise ValueError("patch_torch_functions_type must be torch.float16, torch.bfloat16 or None, "
                             f"found patch_torch_functions_type={value}")
        return value

    def _checked_keep_batchnorm_fp32(self, value):
        if self.casts_functions and value is not None:
            warn_or_err(f"With opt_level {self.opt_level}, batchnorm functions are automatically patched "
                        "to run in FP32, so keep_batchnorm_fp32 should be None."
                        f" keep_batchnorm_fp32 was {value}")
        value = {"True": True, "False": False}.get(value, value) if isinstance(value, str) else value
        if value not in (True, False, None):
            raise ValueError("keep_batchnorm_fp32 must be a boolean, the string 'True' or 'False', "
                             f"or None, found keep_batchnorm_fp32={value}")
        return value

    def _checked_master_weights(self, value):
        if self.casts_functions and value is not None:
            warn_or_err(f"It doesn't make sense to use master_weights with {self.opt_level}. "
                        f"With {self.opt_level}, your model weights themselves should be FP32.")
        return value

    def _checked_combine_ddp(self, value):
        if value and not self.combine_grad:
            warn_or_err("combine_ddp=True averages the flat grad buffers of combine_grad=True over the ranks; "
                        "pass combine_grad=True too.")
        return value

    def _checked_ddp_replica_count(self, value):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"ddp_replica_count must be a positive integer, found ddp_replica_count={value!r}")
        return value

    def _checked_user_cast_preferred(self, value):
        if value and not self.casts_functions:
            warn_or_err("user_cast_preferred=True only applies where amp casts functions: select "
                        "opt_level='O1' (or 'O4' for bfloat16).")
        return value

    def _checked_loss_scale(self, value):
        if value == "dynamic":
            return value
        try:
            scale = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"loss_scale must be 'dynamic' or a positive number, found loss_scale={value!r}") from None
        if not scale > 0:
            raise ValueError(f"loss_scale must be 'dynamic' or a positive number, found loss_scale={value!r}")
        return scale
