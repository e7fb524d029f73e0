"""Checkpoints of the distributed optimizers: a sharded one resumes bit-identically on the same
ranks; a gathered one resumes on another number of ranks and in FusedAdam / torch AdamW on
one process; FusedAdam's and AdamW's state dicts load into DistributedFusedAdam."""
from __future__ import annotations

import copy

import pytest
import torch
import zero_testing as zt
from zero_runs import SAVES, SHARDED_RESUMES, run_all

from apex.optimizers import FusedAdam


@pytest.mark.parametrize("name", SHARDED_RESUMES)
def test_sharded_checkpoint_resumes_bit_identically(results, world, name):
    for rank in range(world):
        got = zt.result_of(results, name, rank)
        for resumed, uninterrupted in zip(got["params"], got["uninterrupted"]):
            assert torch.equal(resumed, uninterrupted)


@pytest.mark.parametrize("name", SAVES)
def test_gathered_checkpoint_on_root_only_or_everywhere(results, world, name):
    for rank in range(world):
        got = zt.result_of(results, name, rank)
        assert (got["checkpoint"]["optimizer"] is None) == (rank != 0)
        everywhere = got["everywhere"]
        assert everywhere["format"] == 2 and sorted(everywhere["state"]) == list(range(len(zt.MANUAL_SHAPES)))
        for index, shape in enumerate(zt.MANUAL_SHAPES):
            entry = everywhere["state"][index]
            assert entry["step"].item() == zt.STEPS // 2
            assert all(entry[key].shape == shape for key in ("param", "exp_avg", "exp_avg_sq"))
    root = zt.result_of(results, name, 0)
    for index, entry in root["checkpoint"]["optimizer"]["state"].items():
        for key, value in entry.items():
            assert torch.equal(value, root["everywhere"]["state"][index][key])


@pytest.mark.parametrize("case", SAVES.values())
def test_two_rank_checkpoint_resumes_on_three_ranks(case):
    three = run_all(3)
    expected, _ = zt.reference_manual(zt.CASES[case], [2] * (zt.STEPS // 2) + [3] * (zt.STEPS - zt.STEPS // 2))
    got = zt.result_of(three, f"from_two_ranks_{case}")
    dtype = zt.CASES[case]["dtype"]
    zt.assert_close(got["params"], [e.to(dtype) for e in expected], dtype)
    assert got["step"] == zt.STEPS


@pytest.mark.parametrize("name", ["from_fused_adam", "from_torch_adamw"])
def test_single_process_checkpoint_resumes_distributed(results, world, name):
    expected, _ = zt.reference_manual(zt.CASES["manual_fp32"], [world] * zt.STEPS)
    got = zt.result_of(results, name)
    zt.assert_close(got["params"], expected, torch.float32, results.device)
    assert got["step"] == zt.STEPS


@pytest.mark.parametrize("optimizer_class", [FusedAdam, torch.optim.AdamW], ids=["FusedAdam", "AdamW"])
def test_gathered_checkpoint_resumes_on_one_process(optimizer_class):
    """The 2-rank checkpoint loads into FusedAdam / AdamW and continues exactly like the ranks did."""
    two = run_all(2)
    saved = zt.result_of(two, "save_gathered_fp32")
    checkpoint = saved["checkpoint"]
    masters = [p.float().clone().requires_grad_() for p in checkpoint["params"]]
    optimizer = optimizer_class(masters, **zt.ADAM)
    optimizer.load_state_dict(copy.deepcopy(checkpoint["optimizer"]))  # they keep the loaded tensors as their state
    model_params = zt.manual_params(torch.float32)
    for step in range(zt.STEPS // 2, zt.STEPS):
        for master, grad in zip(masters, zt.mean_grads(step, 2, model_params)):
            master.grad = grad
        optimizer.step()
    zt.assert_close(masters, saved["params"], torch.float32)


def test_sharded_checkpoint_refuses_another_layout(one_rank_group):
    params = zt.manual_params(torch.float32)
    saved = zt.make_optimizer(zt.CASES["manual_fp32"], params, "cpu").state_dict(gather_on_root=False)
    other = zt.make_optimizer(zt.CASES["manual_fp32"], zt.manual_params(torch.float32), "cpu", bucket_cap_mb=1.0)
    with pytest.raises(ValueError, match="another bucket layout"):
        other.load_state_dict(saved)
    master = zt.make_optimizer(zt.CASES["manual_fp32_bf16_sync_master"], zt.manual_params(torch.float32), "cpu")
    with pytest.raises(ValueError, match="stores model state"):
        master.load_state_dict(saved)


def test_gathered_checkpoint_refuses_other_param_groups(one_rank_group):
    params = zt.manual_params(torch.float32)
    saved = zt.make_optimizer(zt.CASES["manual_fp32"], params, "cpu").state_dict()
    fewer = zt.make_optimizer(zt.CASES["manual_fp32"], zt.manual_params(torch.float32)[:-1], "cpu")
    with pytest.raises(ValueError, match="doesn't match the size"):
        fewer.load_state_dict(saved)
