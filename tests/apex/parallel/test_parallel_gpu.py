"""GPU versions: SyncBatchNorm and DDP on CUDA with NCCL (two ranks when two GPUs exist)."""
from __future__ import annotations

import pytest
import torch

import test_ddp
import test_sync_batchnorm
from parallel_harness import run_ranks

pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


# The large shape gives every channels-last thread many rows (grid-stride loops, a
# partial last group of rows in flight) and the reductions many slices to merge.
@pytest.mark.parametrize("shape", [(8, 32, 14, 14), (64, 64, 33, 31)], ids=["small", "large"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_syncbn_single_gpu_matches_batchnorm(dtype, layout, shape):
    from apex.parallel import SyncBatchNorm

    torch.manual_seed(0)
    memory_format = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = (torch.randn(shape, device="cuda") * 2 + 1).to(dtype).contiguous(memory_format=memory_format)
    dy = torch.randn_like(x)
    ref = torch.nn.BatchNorm2d(shape[1]).cuda()
    bn = SyncBatchNorm(shape[1]).cuda()
    x_ref = x.float().detach().requires_grad_(True)
    x_bn = x.detach().requires_grad_(True)
    y_ref = ref(x_ref)
    y_ref.backward(dy.float())
    y = bn(x_bn)
    y.backward(dy)
    assert y.dtype == dtype and y.is_contiguous(memory_format=memory_format)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(y.float(), y_ref.detach(), **tol)
    torch.testing.assert_close(x_bn.grad.float(), x_ref.grad, **tol)
    torch.testing.assert_close(bn.weight.grad, ref.weight.grad, **tol)
    torch.testing.assert_close(bn.running_var, ref.running_var, **tol)


def test_syncbn_one_rank_nccl():
    results = run_ranks(test_sync_batchnorm.syncbn_worker, 1, ["nchw", "fused_relu_residual"], None, "cuda",
                        backend="nccl")
    for name in ("nchw", "fused_relu_residual"):
        test_sync_batchnorm.assert_matches(results, name, [0])


@two_gpus
def test_syncbn_two_ranks_nccl():
    names = list(test_sync_batchnorm.CASES)
    results = run_ranks(test_sync_batchnorm.syncbn_worker, 2, names, None, "cuda", backend="nccl")
    for name in names:
        test_sync_batchnorm.assert_matches(results, name, [0, 1])


@two_gpus
def test_ddp_two_ranks_nccl():
    cases = [c for c in test_ddp.CASES if c != "retain_buffers"]
    results = run_ranks(test_ddp.ddp_worker, 2, cases, "cuda", backend="nccl")
    for case in cases:
        dtype, _ = test_ddp.CASES[case]
        scale = 2.0 if case == "sum_not_average" else 1.0
        for rank_result in results:
            for it in range(test_ddp.ITERATIONS):
                for name, ref in test_ddp.reference_grads(dtype, 2, it).items():
                    got = rank_result[case]["grads"][it][name]
                    assert (got is None) == (ref is None)
                    if ref is not None:
                        torch.testing.assert_close(got, ref * scale, rtol=3e-2 if dtype == torch.bfloat16 else 1e-4,
                                                   atol=3e-2 if dtype == torch.bfloat16 else 1e-5)


@two_gpus
def test_ddp_rank_without_parameter_gradients_nccl():
    test_ddp.assert_skipping_results(run_ranks(test_ddp.skipping_rank_worker, 2, "cuda", backend="nccl",
                                               timeout=120))


def test_ddp_one_rank_nccl():
    results = run_ranks(test_ddp.ddp_worker, 1, ["one_bucket", "bucket_per_param"], "cuda", backend="nccl")
    for case in ("one_bucket", "bucket_per_param"):
        for it in range(test_ddp.ITERATIONS):
            ref = test_ddp.reference_grads(torch.float32, 1, it)
            for name, want in ref.items():
                got = results[0][case]["grads"][it][name]
                if want is not None:
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
