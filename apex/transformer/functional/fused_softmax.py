"""Fused scale + mask + softmax over attention scores, as Megatron uses it (NVIDIA/ROCm apex's
``apex.transformer.functional.fused_softmax``), over the ``fused_softmax`` ops.

The ops are differentiable in C++ (no Python runs per call in eager mode or under torch.compile);
the ``torch.autograd.Function`` classes below are the historical API over the same kernels.
Unlike upstream's kernels these take any key length, float32 as well as float16/bfloat16, masks
that broadcast over batch, heads or queries, and give zeros for fully masked rows.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from apex._ops import ops
from apex._autocast import cast_if_autocast_enabled
from apex.transformer.enums import AttnMaskType
from apex.transformer.functional._softmax_faces import get_batch_per_block

__all__ = [
    "FusedScaleMaskSoftmax", "GenericFusedScaleMaskSoftmax", "ScaledUpperTriangMaskedSoftmax", "ScaledMaskedSoftmax",
    "GenericScaledMaskedSoftmax", "ScaledSoftmax", "scaled_upper_triang_masked_softmax", "scaled_masked_softmax",
    "generic_scaled_masked_softmax",
]

_LIBRARY = "fused_softmax"
# What the kernels compute in (float32 inside, output in the input's dtype).
_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---- the historical autograd functions -----------------------------------------------------------

class _FusedSoftmaxFunction(torch.autograd.Function):
    """What the four historical autograd Functions share. A subclass names its op pair in ``op``
    (``<op>_forward`` / ``<op>_backward`` of the fused_softmax library) and gets
    ``forward(ctx, inputs, [mask,] scale)``, which saves the probabilities, and ``backward``, which
    reads them (no gradient for mask or scale)."""

    op: str

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        op = cls.op

        def forward(ctx, inputs, *mask_and_scale):
            probs = getattr(ops(_LIBRARY), f"{op}_forward")(inputs, *mask_and_scale)
            ctx.save_for_backward(probs)
            ctx.scale = float(mask_and_scale[-1])
            ctx.non_differentiable_inputs = len(mask_and_scale)
            return probs

        def backward(ctx, output_grads):
            (probs,) = ctx.saved_tensors
            grad = getattr(ops(_LIBRARY), f"{op}_backward")(output_grads, probs, ctx.scale)
            return (grad,) + (None,) * ctx.non_differentiable_inputs

        forward.__qualname__, backward.__qualname__ = f"{cls.__qualname__}.forward", f"{cls.__qualname__}.backward"
        cls.forward, cls.backward = staticmethod(forward), staticmethod(backward)


class ScaledUpperTriangMaskedSoftmax(_FusedSoftmaxFunction):
    """softmax(scale * inputs) with the causal mask: ``apply(inputs, scale)``, inputs [attn_batches, sq, sq],
    float16 / bfloat16 / float32."""

    op = "scaled_upper_triang_masked_softmax"


class ScaledMaskedSoftmax(_FusedSoftmaxFunction):
    """softmax(scale * inputs) with mask (True = masked out): ``apply(inputs, mask, scale)``, inputs
    [b, np, sq, sk], mask [b|1, np|1, sq|1, sk] bool."""

    op = "scaled_masked_softmax"


class GenericScaledMaskedSoftmax(_FusedSoftmaxFunction):
    """ScaledMaskedSoftmax under its "generic" (any sk) name: the kernels are the same."""

    op = "generic_scaled_masked_softmax"


class ScaledSoftmax(_FusedSoftmaxFunction):
    """softmax(scale * inputs) over the last dim of inputs [b, np, sq, sk]: ``apply(inputs, scale)``."""

    op = "scaled_softmax"


# ---- the functional forms (differentiable ops; inputs cast to the autocast dtype inside autocast) ---

def scaled_upper_triang_masked_softmax(inputs: torch.Tensor, _, scale: float) -> torch.Tensor:
    """Causal softmax(scale * inputs) of inputs [b, np, sq, sq]; the second argument (a mask) is ignored."""
    b, np, sq, sk = inputs.size()
    (inputs,) = cast_if_autocast_enabled(inputs)
    probs = ops(_LIBRARY).scaled_upper_triang_masked_softmax_forward(inputs.reshape(-1, sq, sk), scale)
    return probs.view(b, np, sq, sk)


def scaled_masked_softmax(inputs: torch.Tensor, mask: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    """softmax(scale * inputs) of inputs [b, np, sq, sk], positions where mask is True left out (mask None: none)."""
    (inputs,) = cast_if_autocast_enabled(inputs)
    if mask is None:
        return ops(_LIBRARY).scaled_softmax_forward(inputs, scale)
    return ops(_LIBRARY).scaled_masked_softmax_forward(inputs, mask, scale)


def generic_scaled_masked_softmax(inputs: torch.Tensor, mask: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    """scaled_masked_softmax under its "generic" name (upstream: the any-sk kernel; here every kernel is)."""
    (inputs,) = cast_if_autocast_enabled(inputs)
    if mask is None:
        return ops(_LIBRARY).scaled_softmax_forward(inputs, scale)
    return ops(_LIBRARY).generic_scaled_masked_softmax_forward(inputs, mask, scale)


# ---- the module ---------------------------------------------------------------------------------------

class FusedScaleMaskSoftmax(torch.nn.Module):
    """Fused scaling + masking + softmax over attention scores [b, np, sq, sk] (Megatron's module).

    Arguments (as in NVIDIA/ROCm apex):
        input_in_fp16 / input_in_bf16: the scores are float16 / bfloat16 (inside autocast, float32
            scores are cast to the autocast dtype first, as upstream does).
        attn_mask_type: AttnMaskType.causal (the upper triangle is masked; ``mask`` is ignored) or
            AttnMaskType.padding (``mask`` [b|1, np|1, sq|1, sk] bool, True = masked out; None: no mask).
        scaled_masked_softmax_fusion: use the fused kernels.
        mask_func: ``mask_func(scores, mask)`` of the unfused path, e.g. ``scores.masked_fill(mask, -10000.0)``.
            The fused kernels leave masked positions out of the softmax exactly (probability 0, and
            a fully masked row is all zeros rather than uniform).
        softmax_in_fp32: the unfused path computes in float32 (the fused kernels always do).
        scale: scores are multiplied by it first (None: 1); needs softmax_in_fp32.

    The fused kernels take any sk, float16/bfloat16/float32 and any batch/head counts, so this
    falls back to the unfused torch path (``forward_torch_softmax``) only where it must:
      - ``scaled_masked_softmax_fusion`` is False;
      - the scores' dtype is none of float16, bfloat16, float32 (float64);
      - causal masking of non-square scores (sq != sk): there the given mask is applied by mask_func;
      - a padding mask that is not a bool/uint8 tensor broadcastable as [b|1, np|1, sq|1, sk] (an
        additive float mask, say): only mask_func knows what it means.
    """

    def __init__(self, input_in_fp16: bool, input_in_bf16: bool, attn_mask_type: AttnMaskType,
                 scaled_masked_softmax_fusion: bool, mask_func: Callable, softmax_in_fp32: bool,
                 scale: Optional[float]):
        super().__init__()
        self.input_in_fp16 = input_in_fp16
        self.input_in_bf16 = input_in_bf16
        if self.input_in_fp16 and self.input_in_bf16:
            raise RuntimeError("both fp16 and bf16 flags cannot be active at the same time.")
        self.input_in_float16 = self.input_in_fp16 or self.input_in_bf16
        self.attn_mask_type = attn_mask_type
        self.scaled_masked_softmax_fusion = scaled_masked_softmax_fusion
        self.mask_func = mask_func
        self.softmax_in_fp32 = softmax_in_fp32
        self.scale = scale
        if not (self.scale is None or softmax_in_fp32):
            raise RuntimeError("softmax should be in fp32 when scaled")
        if self.scaled_masked_softmax_fusion:
            if self.attn_mask_type == AttnMaskType.causal:
                self.fused_softmax_func = scaled_upper_triang_masked_softmax
            elif self.attn_mask_type == AttnMaskType.padding:
                self.fused_softmax_func = scaled_masked_softmax
            else:
                raise ValueError("Invalid attn_mask_type.")

    def forward(self, input: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        # [b, np, sq, sk]
        assert input.dim() == 4
        if self._kernel_dtype(input) and self.is_kernel_available(mask, *input.size()):
            return self.forward_fused_softmax(input, mask)
        return self.forward_torch_softmax(input, mask)

    def _kernel_dtype(self, input: torch.Tensor) -> bool:
        """Whether the fused kernels take these scores (after the autocast cast, for 16-bit modules)."""
        dtype = input.dtype
        if self.input_in_float16 and input.is_floating_point() and torch.is_autocast_enabled(input.device.type):
            dtype = torch.get_autocast_dtype(input.device.type)
        return dtype in _KERNEL_DTYPES

    def is_kernel_available(self, mask: Optional[torch.Tensor], b: int, np: int, sq: int, sk: int) -> bool:
        if not self.scaled_masked_softmax_fusion or sk <= 0:
            return False
        if self.attn_mask_type == AttnMaskType.causal:
            return sq == sk
        return mask is None or _is_kernel_mask(mask, b, np, sq, sk)

    def forward_fused_softmax(self, input: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        # input.shape = [b, np, sq, sk]
        scale = self.scale if self.scale is not None else 1.0
        if not self.input_in_float16:
            # A float32 module keeps float32 scores inside autocast, as upstream's unfused path did.
            with torch.autocast(input.device.type, enabled=False):
                return self.fused_softmax_func(input, mask, scale)
        return self.fused_softmax_func(input, mask, scale)

    def forward_torch_softmax(self, input: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        if self.input_in_float16 and self.softmax_in_fp32:
            input = input.float()
        if self.scale is not None:
            input = input * self.scale
        mask_output = self.mask_func(input, mask) if mask is not None else input
        probs = torch.nn.Softmax(dim=-1)(mask_output)
        if self.input_in_float16 and self.softmax_in_fp32:
            probs = probs.half() if self.input_in_fp16 else probs.bfloat16()
        return probs

    @staticmethod
    def get_batch_per_block(sq: int, sk: int, b: int, np: int) -> int:
        return get_batch_per_block(sq, sk, b, np)


class GenericFusedScaleMaskSoftmax(FusedScaleMaskSoftmax):
    """FusedScaleMaskSoftmax with a padding mask, under NVIDIA apex's "generic" (any sk) name.

    Upstream it differs by its kernel (one without the sk <= 16384 limit, somewhat slower); here
    every kernel takes any sk, so the two modules behave the same. Arguments as
    FusedScaleMaskSoftmax, without attn_mask_type.
    """

    def __init__(self, input_in_fp16: bool, input_in_bf16: bool, scaled_masked_softmax_fusion: bool,
                 mask_func: Callable, softmax_in_fp32: bool, scale: Optional[float]):
        super().__init__(input_in_fp16, input_in_bf16, AttnMaskType.padding, scaled_masked_softmax_fusion,
                         mask_func, softmax_in_fp32, scale)
        if self.scaled_masked_softmax_fusion:
            self.fused_softmax_func = generic_scaled_masked_softmax


def _is_kernel_mask(mask: torch.Tensor, b: int, np: int, sq: int, sk: int) -> bool:
    """Whether the kernels take `mask`: bool/uint8 of shape [b|1, np|1, sq|1, sk]."""
    if mask.dtype not in (torch.bool, torch.uint8) or mask.dim() != 4 or mask.size(3) != sk:
        return False
    return all(m in (1, full) for m, full in zip(mask.shape[:3], (b, np, sq)))
