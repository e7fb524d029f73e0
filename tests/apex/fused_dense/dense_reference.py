"""The float64 references the fused_dense tests compare against: torch's composites, with every
intermediate rounded to the tested dtype where the fused op stores it in that dtype.

Why round: a fused GELU block stores its pre-activation and its activation in the input's dtype (as
torch's own unfused modules do); a float64 reference that keeps them exact differs from any correct
16-bit implementation by those roundings carried through the second GEMM, which can exceed a
tolerance relative to the output when the output cancels (a 1 x 1 x 1 block: 1e-4 against 0.0118).
With the roundings in the reference, what remains is each output's own final rounding and float32
accumulation, so one tolerance per dtype, in units of its roundoff, holds at every shape.
"""
import torch
import torch.nn.functional as F


def rounded(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t rounded to dtype, kept in t's dtype. Differentiable: the gradient flowing back through it is
    rounded to dtype the same way, as the fused backward stores that gradient."""
    return t.to(dtype).to(t.dtype)


def linear_gelu_linear(x, w1, b1, w2, b2, dtype: torch.dtype, approximate: str = "none") -> torch.Tensor:
    """gelu(x @ w1.T + b1) @ w2.T + b2 with the pre-activation and the activation rounded to dtype."""
    pre = rounded(F.linear(x, w1, b1), dtype)
    return F.linear(rounded(F.gelu(pre, approximate=approximate), dtype), w2, b2)
