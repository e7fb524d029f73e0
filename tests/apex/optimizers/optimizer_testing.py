"""Shared by the fused-optimizer tests: params, reproducible grads, a driver that steps a
fused optimizer beside a reference, and tolerances per dtype."""
from __future__ import annotations

import io
from collections.abc import Callable, Sequence

import pytest
import torch

DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
REDUCED_DTYPES = [torch.float16, torch.bfloat16]

# Odd sizes reach the kernels' tails; 75000 elements span two 65536-element chunks, whose
# partial norms per-tensor-norm kernels (LAMB, NovoGrad) must combine; () is a scalar param.
SHAPES = [(75000,), (33, 17), (7,), (), (64, 64)]
# The grad of this param is None for the first LATE_STEPS steps (a layer unfrozen late):
# its step count then differs from the others'.
LATE_PARAM, LATE_STEPS = 2, 3

# (rtol, atol) after 20 steps: float32 op-order noise, or a couple of roundings of fp16/bf16.
TOLERANCE = {
    torch.float32: (5e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def make_params(dtype: torch.dtype, device: str, seed: int = 0, shapes: Sequence[tuple] = SHAPES) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).to(device=device, dtype=dtype).requires_grad_() for shape in shapes]


def clone_params(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.detach().clone().requires_grad_() for p in params]


def float32_copies(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """float32 copies a reference may update in place (``.float()`` of a float32 tensor is
    the tensor itself, which the reference would then update behind the optimizer's back)."""
    return [p.detach().to(torch.float32, copy=True) for p in params]


def grads_at(step: int, params: list[torch.Tensor], late: bool = False) -> list[torch.Tensor | None]:
    """The grads of step ``step``: the same in every run, independent of the params."""
    generator = torch.Generator().manual_seed(1000 + step)
    grads = [torch.randn(p.shape, generator=generator).to(device=p.device, dtype=p.dtype) for p in params]
    if late and step < LATE_STEPS:
        grads[LATE_PARAM] = None
    return grads


def set_grads(params: list[torch.Tensor], grads: list[torch.Tensor | None]) -> None:
    for param, grad in zip(params, grads):
        param.grad = grad


def train(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], steps: range, late: bool = False) -> None:
    for step in steps:
        set_grads(params, grads_at(step, params, late))
        optimizer.step()


class RoundedShadow:
    """A torch.optim optimizer on float32 copies of the params, rounded to the params' dtype
    after every step (and so are the ``rounded_state`` entries): what a fused kernel does
    when it computes in float32 and stores in fp16/bf16 (``store_dtype``, by default the
    params'). For float32 it is plain torch.optim."""

    def __init__(
        self,
        params: list[torch.Tensor],
        make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
        rounded_state: Sequence[str] = (),
        store_dtype: torch.dtype | None = None,
    ) -> None:
        self.dtype = store_dtype or params[0].dtype
        self.params = [p.requires_grad_() for p in float32_copies(params)]
        self.optimizer = make_optimizer(self.params)
        self.rounded_state = rounded_state

    def step(self, grads: list[torch.Tensor | None]) -> None:
        set_grads(self.params, [None if g is None else g.float() for g in grads])
        self.optimizer.step()
        with torch.no_grad():
            for param in self.params:
                state = self.optimizer.state[param]
                for tensor in [param, *(state[key] for key in self.rounded_state if key in state)]:
                    tensor.copy_(tensor.to(self.dtype))


def assert_params_close(actual: list[torch.Tensor], expected: list[torch.Tensor], dtype: torch.dtype) -> None:
    rtol, atol = TOLERANCE[dtype]
    for index, (a, e) in enumerate(zip(actual, expected)):
        torch.testing.assert_close(
            a.detach().float().cpu(), e.detach().float().cpu(), rtol=rtol, atol=atol, msg=lambda m: f"param {index}: {m}"
        )


def train_beside(
    optimizer: torch.optim.Optimizer, params: list[torch.Tensor], reference, steps: int = 20, late: bool = False
) -> None:
    """Step ``optimizer`` and ``reference`` (``.step(grads)``, ``.params``) on the same grads."""
    for step in range(steps):
        grads = grads_at(step, params, late)
        # Kernels may write into the grads (LAMB leaves its update there): the reference keeps its own.
        set_grads(params, [None if g is None else g.clone() for g in grads])
        optimizer.step()
        reference.step(grads)


def compare_with_reference(
    optimizer: torch.optim.Optimizer, params: list[torch.Tensor], reference, steps: int = 20, late: bool = False
) -> None:
    """``train_beside``, then assert the params agree within the dtype's tolerance."""
    train_beside(optimizer, params, reference, steps, late)
    assert_params_close(params, reference.params, params[0].dtype)


def save_and_load(state_dict: dict) -> dict:
    """A state dict as it comes back from disk (no tensor shared with the original)."""
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer)
