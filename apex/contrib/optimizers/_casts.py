"""Copies between parameters and the buffers parameters are gathered in, whatever their dtypes.

Between floating-point dtypes a copy converts values. A non-floating ``param_sync_dtype``
(uint8, int16, int32, int64, ...) carries raw bits instead, as in NVIDIA apex: the most
significant bytes of each value are copied and any further low bytes of the destination are
zeroed. So an fp32 parameter gathered in int64 or int32 arrives bit for bit; an fp16 one
gathered in uint8 keeps its top byte (sign, exponent and two mantissa bits: fp8 e5m2 by
truncation); an fp32 value gathered in int32 into a bf16 parameter is truncated to bf16.
Byte order is the machine's, little-endian on every platform torch supports for these ops.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

if sys.byteorder != "little":  # the most significant bytes are the last ones only on little-endian machines
    raise ImportError("apex's distributed optimizers assume a little-endian machine")


def reinterprets(sync_dtype: torch.dtype, param_dtype: torch.dtype) -> bool:
    """Whether a buffer of ``sync_dtype`` can hold ``param_dtype`` values as they are (a view)."""
    return sync_dtype == param_dtype or (not sync_dtype.is_floating_point and
                                         sync_dtype.itemsize == param_dtype.itemsize)


def as_param_view(buffer: torch.Tensor, param_dtype: torch.dtype) -> torch.Tensor:
    """``buffer`` seen as ``param_dtype`` (``reinterprets`` must hold)."""
    return buffer if buffer.dtype == param_dtype else buffer.view(param_dtype)


def _byte_pair(out: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(destination bytes, source bytes, destination low bytes to zero) of 1-D ``out`` and ``value``."""
    out_bytes = out.view(-1, 1).view(torch.uint8)
    in_bytes = value.view(-1, 1).view(torch.uint8)
    width = min(out_bytes.shape[1], in_bytes.shape[1])
    low = out_bytes[:, :-width] if width < out_bytes.shape[1] else None
    return out_bytes[:, -width:], in_bytes[:, -width:], low


def cast_into(out: torch.Tensor, value: torch.Tensor) -> None:
    """``out`` = ``value`` (flat tensors of one length): converted between floating dtypes,
    else its most significant bytes."""
    foreach_cast_into([out], [value])


def foreach_cast_into(outs: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
    """``cast_into`` for each pair, one fused copy for the pairs of floating dtypes."""
    float_outs, float_values, byte_outs, byte_values, lows = [], [], [], [], []
    for out, value in zip(outs, values):
        if out.numel() == 0 or out.data_ptr() == value.data_ptr() and out.dtype == value.dtype:
            continue
        if out.dtype.is_floating_point and value.dtype.is_floating_point or out.dtype == value.dtype:
            float_outs.append(out)
            float_values.append(value)
            continue
        out_bytes, in_bytes, low = _byte_pair(out, value)
        byte_outs.append(out_bytes)
        byte_values.append(in_bytes)
        if low is not None:
            lows.append(low)
    if float_outs:
        torch._foreach_copy_(float_outs, float_values)
    for out_bytes, in_bytes in zip(byte_outs, byte_values):
        out_bytes.copy_(in_bytes)
    for low in lows:
        low.zero_()
