"""apex.parallel.SyncBatchNorm across ranks: outputs, gradients and running stats must
equal torch BatchNorm over the concatenated global batch."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from parallel_harness import run_ranks

C = 5
# name: (per-rank batch sizes, spatial shape, layout, dtype, module options)
CASES = {
    "nchw": ((3, 3), (4, 6), "nchw", torch.float32, {}),
    "unequal_batches": ((1, 6), (3, 5), "nchw", torch.float32, {}),
    "channels_last_strided": ((2, 3), (4, 4), "channels_last_strided", torch.float32, {}),
    "nhwc_channel_last": ((2, 2), (3, 4), "nhwc", torch.float32, {"channel_last": True}),
    "fused_relu_residual": ((2, 3), (3, 3), "nhwc", torch.float32, {"channel_last": True, "fuse_relu": True}),
    "2d_input": ((4, 7), (), "nchw", torch.float32, {}),
    "3d_input": ((2, 2), (9,), "nchw", torch.float32, {}),
    "no_affine_cumulative": ((3, 2), (4, 4), "nchw", torch.float32, {"affine": False, "momentum": None}),
    "bf16": ((3, 3), (4, 6), "nchw", torch.bfloat16, {}),
}
STEPS = 2  # running statistics accumulate over steps


def case_data(name, step):
    sizes, spatial, layout, dtype, _ = CASES[name]
    g = torch.Generator().manual_seed(7 + 31 * step + len(name))
    shape = (sum(sizes), C, *spatial)
    x = (torch.randn(shape, generator=g) * 3 + 2).to(dtype)
    dy = torch.randn(shape, generator=g).to(dtype)
    z = torch.randn(shape, generator=g).to(dtype)
    return x, dy, z


def to_layout(t, layout):
    if layout == "nhwc":
        return t.permute(0, 2, 3, 1).contiguous()
    if layout == "channels_last_strided":
        return t.contiguous(memory_format=torch.channels_last)
    return t


def from_layout(t, layout):
    return t.permute(0, 3, 1, 2) if layout == "nhwc" else t


def make_module(name, process_group=None):
    from apex.parallel import SyncBatchNorm

    *_, dtype, options = CASES[name]
    torch.manual_seed(3)
    bn = SyncBatchNorm(C, process_group=process_group, **options)
    if bn.affine:
        with torch.no_grad():
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    return bn.to(dtype)


def syncbn_worker(rank, world_size, names, groups, device):
    """Runs STEPS training steps then one eval step of every case; `groups` lists the
    rank groups normalized together (None: all ranks)."""
    import torch.distributed as dist

    process_group, members = None, list(range(world_size))
    if groups is not None:
        for ranks in groups:
            group = dist.new_group(ranks)
            if rank in ranks:
                process_group, members = group, ranks
    position = members.index(rank)
    results = {}
    for name in names:
        sizes, _, layout, _, options = CASES[name]
        bn = make_module(name, process_group).to(device)
        # A lone rank takes the whole global batch.
        start, stop = (0, sum(sizes)) if len(members) == 1 else (sum(sizes[:position]), sum(sizes[:position + 1]))
        steps = []
        for step in range(STEPS + 1):
            bn.train(step < STEPS)
            x, dy, z = (to_layout(t[start:stop], layout).to(device) for t in case_data(name, step))
            x.requires_grad_(True)
            z.requires_grad_(True)
            y = bn(x, z) if options.get("fuse_relu") else bn(x)
            y.backward(dy)
            steps.append({
                "y": from_layout(y.detach(), layout).float().cpu(),
                "dx": from_layout(x.grad, layout).float().cpu(),
                "dz": from_layout(z.grad, layout).float().cpu() if z.grad is not None else None,
                "dweight": bn.weight.grad.float().cpu() if bn.affine else None,
                "dbias": bn.bias.grad.float().cpu() if bn.affine else None,
                "y_channels_last": y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous(),
            })
            bn.zero_grad()
        results[name] = {"steps": steps, "running_mean": bn.running_mean.float().cpu(),
                         "running_var": bn.running_var.float().cpu(), "slice": (start, stop)}
    return results


def reference(name):
    """torch BatchNorm on each step's global batch; grads of weight/bias per rank slice summed."""
    sizes, _, _, dtype, options = CASES[name]
    bn = make_module(name)
    ref = torch.nn.BatchNorm2d(C, momentum=options.get("momentum", 0.1), affine=options.get("affine", True))
    ref.load_state_dict(bn.float().state_dict())
    steps = []
    for step in range(STEPS + 1):
        ref.train(step < STEPS)
        x, dy, z = (t.float() for t in case_data(name, step))
        x.requires_grad_(True)
        z.requires_grad_(True)
        y = F.batch_norm(x, ref.running_mean, ref.running_var, ref.weight, ref.bias, ref.training,
                         ref.momentum if ref.momentum is not None else 1.0 / (step + 1), ref.eps)
        if options.get("fuse_relu"):
            y = torch.relu(y + z)
        y.backward(dy)
        steps.append({"y": y.detach(), "dx": x.grad, "dz": z.grad if options.get("fuse_relu") else None,
                      "dweight": ref.weight.grad.clone() if ref.affine else None,
                      "dbias": ref.bias.grad.clone() if ref.affine else None})
        ref.zero_grad()
    return steps, ref.running_mean, ref.running_var


def assert_matches(results, name, members):
    dtype = CASES[name][3]
    tol = dict(rtol=3e-2, atol=3e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    ref_steps, ref_mean, ref_var = reference(name)
    for step, ref in enumerate(ref_steps):
        for key in ("y", "dx", "dz"):
            if ref[key] is None:
                continue
            got = torch.cat([results[r][name]["steps"][step][key] for r in members])
            torch.testing.assert_close(got, ref[key], **tol)
        for key in ("dweight", "dbias"):  # each rank holds its slice's share (DDP sums them)
            if ref[key] is not None:
                got = sum(results[r][name]["steps"][step][key] for r in members)
                torch.testing.assert_close(got, ref[key], **tol)
    for r in members:
        torch.testing.assert_close(results[r][name]["running_mean"], ref_mean, **tol)
        torch.testing.assert_close(results[r][name]["running_var"], ref_var, **tol)


@pytest.fixture(scope="module")
def two_rank_results():
    return run_ranks(syncbn_worker, 2, list(CASES), None, "cpu")


@pytest.mark.parametrize("case", list(CASES))
def test_syncbn_matches_batchnorm_over_global_batch(two_rank_results, case):
    assert_matches(two_rank_results, case, [0, 1])


def test_channels_last_strided_input_gives_channels_last_output(two_rank_results):
    assert all(s["y_channels_last"] for s in two_rank_results[0]["channels_last_strided"]["steps"])


def test_syncbn_two_process_groups_on_four_ranks():
    """Ranks {0, 1} and {2, 3} normalize separately; each pair must match BatchNorm over
    its own pair's batch (both pairs see the same data, so each matches the reference)."""
    results = run_ranks(syncbn_worker, 4, ["nchw", "unequal_batches"], [[0, 1], [2, 3]], "cpu")
    for members in ([0, 1], [2, 3]):
        for name in ("nchw", "unequal_batches"):
            assert_matches(results, name, members)
