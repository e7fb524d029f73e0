"""An fp32 value kept as a bf16 value plus the 16 bits bf16 drops (``store_param_remainders``).

bf16 is the upper half of an fp32 bit pattern. Keeping the lower half (the remainder)
beside the bf16 model parameter recovers the fp32 master value bit for bit, for 2 bytes per
element instead of the 4 of an fp32 copy. The bf16 half is rounded to nearest (ties away
from zero): it is the truncated upper half plus one unit when the remainder's top bit is
set, which is what a negative int16 remainder says, so unpacking subtracts that unit again.
"""
from __future__ import annotations

import torch

_LOW_HALF = 0xFFFF


@torch.no_grad()
def pack(bf16: torch.Tensor, remainders: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out`` (float32) = the fp32 values whose rounded halves are ``bf16`` and low halves ``remainders`` (int16)."""
    upper = bf16.view(torch.int16).to(torch.int32) - (remainders < 0).to(torch.int32)
    bits = torch.bitwise_or(upper << 16, remainders.to(torch.int32) & _LOW_HALF)
    return out.copy_(bits.view(torch.float32))


@torch.no_grad()
def split(fp32: torch.Tensor, bf16_out: torch.Tensor, remainders_out: torch.Tensor) -> None:
    """Store float32 ``fp32`` as its rounded bf16 half and its int16 low half."""
    bits = fp32.view(torch.int32)
    low = bits.view(torch.int16)[0::2]  # little-endian: the low half comes first
    remainders_out.copy_(low)
    upper = (bits >> 16) + (low < 0).to(torch.int32)
    bf16_out.copy_(upper.to(torch.int16).view(torch.bfloat16))
