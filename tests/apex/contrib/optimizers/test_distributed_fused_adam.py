"""DistributedFusedAdam on 1, 2 and 3 gloo ranks equals AdamW on one process over the global batch.

Cases (zero_testing.CASES) cover overlap on and off (gradients and parameters), contiguous
buffers, gradient accumulation with and without no_sync, clipping, param groups, uneven
parameter sizes split across buckets and shards, bf16/fp16 parameters with float32 state,
bf16 remainders, scaled 16-bit state, capturable steps, GradScaler with a skipped step,
redundant (replicated) shards, integer gather dtypes (raw bits), float64 parameters and
per-parameter sync dtypes.
"""
from __future__ import annotations

import pytest
import torch
import zero_testing as zt

TRAIN = [n for n, c in zt.CASES.items() if c["kind"] == "train" and c["optimizer"] == "adam"]
MANUAL = [n for n, c in zt.CASES.items() if c["kind"] == "manual" and c["optimizer"] == "adam"]


def _assert_replicas_equal(results, name):
    """Every rank ends with the same parameters, bit for bit (they were all-gathered)."""
    first = zt.result_of(results, name, 0)["params"]
    for rank in range(1, len(results)):
        for a, b in zip(zt.result_of(results, name, rank)["params"], first):
            assert torch.equal(a, b), f"rank {rank} differs from rank 0"


@pytest.mark.parametrize("name", TRAIN)
def test_training_equals_adamw_on_the_global_batch(results, world, name):
    case = zt.CASES[name]
    expected, norms = zt.reference_train(case, world)
    got = zt.result_of(results, name)
    zt.assert_close(got["params"], expected, torch.float32, results.device)
    _assert_replicas_equal(results, name)
    if case.get("clip"):  # the norms clip_grad_norm returned: those of the global batch's gradients
        torch.testing.assert_close(torch.stack(got["norms"]).reshape(-1), torch.stack(norms), rtol=1e-5, atol=1e-6)


def _narrowest(*dtypes):
    """The least precise of the floating dtypes (an integer gather dtype carries the bits as they are)."""
    return max((d for d in dtypes if d.is_floating_point), key=lambda d: torch.finfo(d).eps)


@pytest.mark.parametrize("name", MANUAL)
def test_mean_gradients_step_like_the_reference(results, world, name):
    """The optimizer's float32 copy follows the reference; the model holds it rounded to the
    narrowest of its dtype and the gather dtype."""
    case = zt.CASES[name]
    expected, _ = zt.reference_manual(case, [world] * zt.STEPS)
    got = zt.result_of(results, name)
    options = case["options"]
    state_dtype = case.get("state_tolerance") or options.get("grad_sync_dtype", torch.float32)
    zt.assert_close(got["master"], expected, state_dtype, results.device)
    model_dtype = case.get("model_tolerance") or _narrowest(
        case["dtype"], options.get("param_sync_dtype", options.get("dtype", torch.float32)), torch.float32)
    zt.assert_close(got["params"], [e.to(model_dtype) for e in expected], model_dtype, results.device)
    _assert_replicas_equal(results, name)


def test_grad_scaler_skips_the_overflowing_step_and_backs_off(results, world):
    got = zt.result_of(results, "manual_grad_scaler", world - 1)
    assert got["scales"] == [1024.0, 1024.0, 1024.0, 512.0]


def test_bf16_remainders_keep_the_float32_master_exactly(results):
    """Same gradients, so the bf16 + 16-bit remainder copy must equal the float32 master copy bit for bit."""
    remainders = zt.result_of(results, "manual_bf16_remainders")["master"]
    master = zt.result_of(results, "manual_bf16_master")["master"]
    for a, b in zip(remainders, master):
        assert torch.equal(a, b)


def test_capturable_steps_like_the_plain_one(results):
    capturable = zt.result_of(results, "manual_capturable")["params"]
    plain = zt.result_of(results, "manual_fp32")["params"]
    for a, b in zip(capturable, plain):
        assert torch.equal(a, b)
