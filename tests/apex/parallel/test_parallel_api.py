"""Single-process behaviour of apex.parallel: convert_syncbn_model, LARC against a
written reference, SyncBatchNorm without a process group, and clear errors."""
from __future__ import annotations

import copy

import pytest
import torch

from apex.parallel import LARC, DistributedDataParallel, Reducer, SyncBatchNorm, convert_syncbn_model


def small_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3), torch.nn.BatchNorm2d(6), torch.nn.ReLU(),
                               torch.nn.Sequential(torch.nn.Conv2d(6, 4, 1), torch.nn.BatchNorm2d(4, momentum=None)),
                               torch.nn.InstanceNorm2d(4))


def test_convert_syncbn_model_keeps_weights_buffers_and_mode():
    net = small_net()
    net[3][1].eval()
    with torch.no_grad():
        net[1].running_mean.uniform_()
        net[1].weight.uniform_()
    original = copy.deepcopy(net)
    bn_weight = net[1].weight
    converted = convert_syncbn_model(net)
    assert isinstance(converted[1], SyncBatchNorm) and isinstance(converted[3][1], SyncBatchNorm)
    assert isinstance(converted[4], torch.nn.InstanceNorm2d)
    assert converted[1].weight is bn_weight  # optimizers built before conversion still see it
    assert not converted[3][1].training and converted[1].training
    state = converted.state_dict()
    assert state.keys() == original.state_dict().keys()
    for key, value in original.state_dict().items():
        torch.testing.assert_close(state[key], value)
    x = torch.randn(4, 3, 8, 8)
    for mode in ("train", "eval"):
        getattr(original, mode)()
        getattr(converted, mode)()
        torch.testing.assert_close(converted(x), original(x), rtol=1e-5, atol=1e-5)
    # Round trip: the converted model's state loads back into plain BatchNorm layers.
    restored = small_net().eval()
    restored.load_state_dict(converted.state_dict())
    torch.testing.assert_close(restored(x), converted(x), rtol=1e-5, atol=1e-5)


def test_syncbn_without_process_group_is_batchnorm_in_train_and_eval():
    torch.manual_seed(1)
    ref, bn = torch.nn.BatchNorm2d(3), SyncBatchNorm(3)
    x = torch.randn(5, 3, 4, 4) * 4 + 1
    for training in (True, True, False):
        ref.train(training)
        bn.train(training)
        torch.testing.assert_close(bn(x), ref(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    assert bn.num_batches_tracked.item() == 2


def larc_reference(params, grads, lr, weight_decay, trust, clip, eps):
    """NVIDIA apex's LARC step for plain SGD, element by element in Python floats."""
    updated = []
    for p, g in zip(params, grads):
        p_norm, g_norm = p.norm().item(), g.norm().item()
        if p_norm != 0 and g_norm != 0:
            local = trust * p_norm / (g_norm + p_norm * weight_decay + eps)
            if clip:
                local = min(local / lr, 1.0)
            g = (g + weight_decay * p) * local
        updated.append(p - lr * g)
    return updated


@pytest.mark.parametrize("clip", [True, False])
@pytest.mark.parametrize("weight_decay", [0.0, 1e-2])
def test_larc_matches_reference(clip, weight_decay):
    torch.manual_seed(2)
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.zeros(4)),
              torch.nn.Parameter(torch.randn(7) * 50)]
    grads = [torch.randn(5, 3), torch.randn(4), torch.randn(7) * 1e-3]
    want = larc_reference([p.detach().clone() for p in params], grads, 0.1, weight_decay, 0.02, clip, 1e-8)
    optimizer = LARC(torch.optim.SGD(params, lr=0.1, weight_decay=weight_decay), clip=clip)
    for p, g in zip(params, grads):
        p.grad = g.clone()
    optimizer.step()
    for p, w in zip(params, want):
        torch.testing.assert_close(p.detach(), w, rtol=1e-5, atol=1e-6)
    assert optimizer.param_groups[0]["weight_decay"] == weight_decay  # restored after the step
    assert optimizer.state_dict().keys() == {"state", "param_groups"}


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="4-D"):
        SyncBatchNorm(4, channel_last=True)(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="expected 4 channels"):
        SyncBatchNorm(4)(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        SyncBatchNorm(4)(torch.randn(4))
    with pytest.raises(ValueError, match="fuse_relu and z need a channels-last layout"):
        SyncBatchNorm(4, fuse_relu=True)(torch.randn(2, 4, 3, 3))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        SyncBatchNorm(4)(torch.randn(1, 4))
    with pytest.raises(RuntimeError, match="init_process_group"):
        SyncBatchNorm(4, process_group=object())(torch.randn(2, 4))
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedDataParallel(torch.nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="init_process_group"):
        Reducer(torch.nn.Linear(2, 2))


@pytest.fixture
def single_rank_group():
    import torch.distributed as dist

    from parallel_harness import COLLECTIVE_TIMEOUT, free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=COLLECTIVE_TIMEOUT)
    yield
    dist.destroy_process_group()


def test_ddp_rejects_mixed_devices_and_shared_param(single_rank_group):
    mixed = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, device="meta"))
    with pytest.raises(ValueError, match="whole module on one device"):
        DistributedDataParallel(mixed)
    with pytest.raises(ValueError, match="shared_param is no longer supported"):
        DistributedDataParallel(torch.nn.Linear(2, 2), shared_param=True)
    with pytest.raises(ValueError, match="message_size must be positive"):
        DistributedDataParallel(torch.nn.Linear(2, 2), message_size=0)
    with pytest.raises(ValueError, match="allreduce_trigger_params must be parameters of the module"):
        DistributedDataParallel(torch.nn.Linear(2, 2), allreduce_trigger_params=[torch.nn.Parameter(torch.ones(1))])
    with pytest.warns(FutureWarning, match="gradient_predivide_factor"):
        ddp = DistributedDataParallel(torch.nn.Linear(2, 2), gradient_average_split_factor=2.0)
    assert ddp.gradient_predivide_factor == 2.0
