"""combine_ddp=True (Ascend apex's amp.initialize knob): amp's flat grad buffers averaged over the
torch.distributed ranks (gloo on CPU here), each in up to ddp_replica_count chunks that start
reducing while the backward still runs."""
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from amp_testing import initialized, make_batches, make_net, params_of, train
from apex import amp

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="needs torch.distributed")


@pytest.fixture
def single_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def reducer_of(optimizer):
    return optimizer._amp_stash.grad_sets[0].reducer


def assert_trains_exactly_like_combine_grad(opt_level, device="cpu"):
    batches = make_batches("mlp", device)
    runs = []
    for combine_ddp in (False, True):
        model, optimizer = initialized("mlp", opt_level, device, combine_grad=True, combine_ddp=combine_ddp)
        runs.append((train("mlp", model, optimizer, batches, steps=6), params_of(model, optimizer)))
    (losses, (params, masters)), (ddp_losses, (ddp_params, ddp_masters)) = runs
    assert losses == ddp_losses
    assert all(torch.equal(a, b) for a, b in zip(params + masters, ddp_params + ddp_masters))


@pytest.mark.parametrize("opt_level", ["O0", "O1", "O2", "O4", "O5"])
def test_one_rank_trains_exactly_like_combine_grad(single_rank, opt_level):
    assert_trains_exactly_like_combine_grad(opt_level)


@pytest.mark.gpu
@pytest.mark.parametrize("opt_level", ["O1", "O2", "O5"])
def test_one_cuda_rank_over_nccl_trains_exactly_like_combine_grad(tmp_path, opt_level):
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        assert_trains_exactly_like_combine_grad(opt_level, "cuda")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("replica_count", [1, 2, 4, 100])
def test_buffers_are_cut_into_up_to_replica_count_chunks_between_params(single_rank, replica_count):
    model, optimizer = initialized("mlp", "O1", combine_grad=True, combine_ddp=True, ddp_replica_count=replica_count)
    reducer = reducer_of(optimizer)
    grads = optimizer._amp_stash.grad_sets[0]
    buffer, = grads.buffers
    param_starts = {p.grad.data_ptr() for p in grads.params}
    assert all(chunk.data_ptr() in param_starts for chunk, _ in reducer.chunks)  # cut between params
    assert sum(chunk.numel() for chunk, _ in reducer.chunks) == buffer.numel()
    assert sum(count for _, count in reducer.chunks) == 6  # the MLP's 6 params, each in one chunk
    # The MLP's biggest param is 1024 of 1744 elements, so at most one chunk per param and never
    # more than asked for; one chunk when asked for one, one per param when asked for many.
    expected = {1: 1, 100: 6}.get(replica_count)
    assert len(reducer.chunks) == expected if expected else 1 < len(reducer.chunks) <= replica_count


def test_chunks_start_reducing_during_the_backward(single_rank):
    model, optimizer = initialized("mlp", "O2", combine_grad=True, combine_ddp=True, ddp_replica_count=3)
    (x, y), = make_batches("mlp", count=1)
    reducer = reducer_of(optimizer)
    with amp.scale_loss(F.mse_loss(model(x), y), optimizer) as scaled_loss:
        scaled_loss.backward()
        assert all(work is not None for work in reducer._works)  # all launched by the grad hooks
    assert all(work is None for work in reducer._works)  # finished before the unscale
    optimizer.step()


def test_unused_params_and_delayed_unscale(single_rank):
    """Accumulating over two backward passes (delay_unscale) reduces once, at the last; a param
    without a grad in the last backward is reduced by finish()."""
    runs = []
    for combine_ddp in (False, True):
        model, optimizer = initialized("mlp", "O1", combine_grad=True, combine_ddp=combine_ddp)
        (x, y), (x2, y2) = make_batches("mlp", count=2)
        optimizer.zero_grad()
        with amp.scale_loss(F.mse_loss(model(x), y), optimizer, delay_unscale=True) as scaled_loss:
            scaled_loss.backward()
        head_only = model[4](torch.relu(model[2](torch.relu(model[0](x2))).detach()))
        with amp.scale_loss(F.mse_loss(head_only, y2), optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        runs.append(params_of(model, optimizer)[0])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_two_backward_passes_in_one_block_are_refused(single_rank):
    model, optimizer = initialized("mlp", "O1", combine_grad=True, combine_ddp=True)
    (x, y), = make_batches("mlp", count=1)
    loss = F.mse_loss(model(x), y)
    with pytest.raises(RuntimeError, match="once per backward"):
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward(retain_graph=True)
            scaled_loss.backward()


def test_needs_combine_grad_and_a_process_group(single_rank):
    with pytest.raises(RuntimeError, match="combine_grad=True"):
        initialized("mlp", "O1", combine_ddp=True)
    with pytest.raises(ValueError, match="ddp_replica_count"):
        initialized("mlp", "O1", combine_grad=True, combine_ddp=True, ddp_replica_count=0)


def test_needs_an_initialized_process_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        initialized("mlp", "O1", combine_grad=True, combine_ddp=True)


def _train_on_rank(rank, rendezvous, out_dir, opt_level, steps):
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    model = make_net("mlp", seed=rank)  # different weights: amp.initialize broadcasts rank 0's
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level, combine_grad=True, combine_ddp=True,
                                      ddp_replica_count=2, verbosity=0)
    batches = make_batches("mlp", count=2 * steps)[rank::2]  # each rank its own half of every step
    train("mlp", model, optimizer, batches, steps)
    torch.save([p.detach().float() for p in model.parameters()], os.path.join(out_dir, f"{opt_level}{rank}.pt"))
    dist.destroy_process_group()


def _train_both_levels(rank, rendezvous_dir, out_dir, steps):
    for opt_level in ("O0", "O2"):
        _train_on_rank(rank, os.path.join(rendezvous_dir, opt_level), out_dir, opt_level, steps)


def test_two_ranks_average_their_grads():
    """Two gloo ranks on different halves of each batch end where one process ends on the full
    batches (mean loss = mean of the two halves' mean losses): exactly alike in fp32 (O0) and in
    fp16 with fp32 masters (O2), the two ranks bitwise equal."""
    steps = 3
    with tempfile.TemporaryDirectory() as rendezvous_dir, tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_train_both_levels, args=(rendezvous_dir, out_dir, steps), nprocs=2)
        results = {name: torch.load(os.path.join(out_dir, f"{name}.pt")) for name in ("O00", "O01", "O20", "O21")}

    reference = make_net("mlp", seed=0)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    batches = make_batches("mlp", count=2 * steps)
    full_batches = [(torch.cat([batches[2 * i][0], batches[2 * i + 1][0]]),
                     torch.cat([batches[2 * i][1], batches[2 * i + 1][1]])) for i in range(steps)]
    train("mlp", reference, optimizer, full_batches, steps, use_amp=False)
    expected = [p.detach() for p in reference.parameters()]

    for level, tolerance in (("O0", 1e-6), ("O2", 2e-3)):
        rank0, rank1 = results[level + "0"], results[level + "1"]
        assert all(torch.equal(a, b) for a, b in zip(rank0, rank1))
        for got, want in zip(rank0, expected):
            torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
