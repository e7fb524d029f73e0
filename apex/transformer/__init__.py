"""apex.transformer: the fused transformer ops Megatron-style code imports.

- ``apex.transformer.enums``: AttnMaskType, AttnType, LayerType, ModelType;
- ``apex.transformer.functional``: FusedScaleMaskSoftmax / GenericFusedScaleMaskSoftmax and their
  autograd functions, fused RoPE (sbhd/bshd, thd, 2-D), fused bias-SwiGLU.

Their compiled kernels are also importable under the historical module names
(``scaled_upper_triang_masked_softmax_cuda``, ``scaled_masked_softmax_cuda``,
``generic_scaled_masked_softmax_cuda``, ``scaled_softmax_cuda``,
``fused_rotary_positional_embedding``, ``fused_bias_swiglu``). NVIDIA apex's model-parallel parts
of apex.transformer (parallel_state, tensor_parallel, pipeline_parallel) are not part of this package.
"""
from apex.transformer import enums, functional
from apex.transformer.enums import AttnMaskType, AttnType, LayerType, ModelType

__all__ = ["enums", "functional", "AttnMaskType", "AttnType", "LayerType", "ModelType"]
