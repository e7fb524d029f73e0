"""apex.parallel.DistributedDataParallel and Reducer on real process groups: the
averaged gradients must equal single-process gradients of the full batch."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from parallel_harness import run_ranks

BATCH_PER_RANK = 4
ITERATIONS = 3  # the first discovers the buckets, later ones overlap


class TiedNet(torch.nn.Module):
    """`hidden` runs twice and `embed`'s weight is reused transposed as the output layer
    (shared parameters); `unused` never runs."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(8, 16)
        self.hidden = torch.nn.Linear(16, 16)
        self.unused = torch.nn.Linear(16, 4)
        self.register_buffer("offset", torch.zeros(8))

    def forward(self, x):
        h = torch.tanh(self.embed(x + self.offset))
        h = torch.tanh(self.hidden(torch.tanh(self.hidden(h))))
        return F.linear(h, self.embed.weight.t())


def make_model(dtype):
    torch.manual_seed(0)
    return TiedNet().to(dtype)


def global_batch(iteration, world_size, dtype):
    g = torch.Generator().manual_seed(100 + iteration)
    return torch.randn(BATCH_PER_RANK * world_size, 8, generator=g).to(dtype)


def loss_of(model, x):
    return model(x).float().pow(2).mean()


CASES = {
    "one_bucket": (torch.float32, {}),
    "bucket_per_param": (torch.float32, {"message_size": 1}),
    "small_buckets": (torch.float32, {"message_size": 200}),
    "delay_allreduce": (torch.float32, {"delay_allreduce": True, "message_size": 200}),
    "trigger_params": (torch.float32, {"allreduce_trigger_params": "hidden.weight"}),
    "two_communicators": (torch.float32, {"num_allreduce_streams": 2, "message_size": 1}),
    "predivide": (torch.float32, {"gradient_predivide_factor": 2.0, "message_size": 200}),
    "sum_not_average": (torch.float32, {"gradient_average": False}),
    "retain_buffers": (torch.float32, {"retain_allreduce_buffers": True, "message_size": 1}),
    "bf16": (torch.bfloat16, {"message_size": 200}),
    "bf16_fp32_allreduce": (torch.bfloat16, {"allreduce_always_fp32": True, "message_size": 1}),
}


def ddp_worker(rank, world_size, case_names, device):
    from apex.parallel import DistributedDataParallel

    results = {}
    for name in case_names:
        dtype, options = CASES[name]
        model = make_model(dtype).to(device)
        if rank != 0:  # construction must broadcast rank 0's values
            with torch.no_grad():
                for t in list(model.parameters()) + list(model.buffers()):
                    t.add_(1.0)
        options = dict(options)
        if options.get("allreduce_trigger_params"):
            options["allreduce_trigger_params"] = [model.get_parameter(options["allreduce_trigger_params"])]
        ddp = DistributedDataParallel(model, **options)
        grads, buffers = [], []
        names = {id(p): n for n, p in model.named_parameters()}
        for it in range(ITERATIONS):
            x = global_batch(it, world_size, dtype)[rank * BATCH_PER_RANK:(rank + 1) * BATCH_PER_RANK].to(device)
            model.zero_grad(set_to_none=True)
            loss_of(ddp, x).backward()
            grads.append({n: None if p.grad is None else p.grad.float().cpu() for n, p in model.named_parameters()})
            buffers.append([b.float().cpu() for b in ddp.allreduce_buffers])
        results[name] = {
            "grads": grads,
            "buffers": buffers,
            "bucket_names": [[names[id(p)] for p in bucket] for bucket in ddp.bucket_parameters],
            "state": {k: v.float().cpu() for k, v in model.state_dict().items()},
        }
    return results


def reducer_worker(rank, world_size):
    from apex.parallel import Reducer

    model = make_model(torch.float32)
    if rank != 0:
        with torch.no_grad():
            model.embed.weight.add_(1.0)
    reducer = Reducer(model)
    x = global_batch(0, world_size, torch.float32)[rank * BATCH_PER_RANK:(rank + 1) * BATCH_PER_RANK]
    loss_of(model, x).backward()
    reducer.reduce()
    tensors = [torch.full((3,), float(rank)), [torch.full((2, 2), 2.0 * rank)]]
    Reducer(tensors).reduce()
    return {"grads": {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, "tensors": tensors}


class SkippableNet(torch.nn.Module):
    """`use_params=False` takes a branch without parameters: that rank's backward then
    produces no parameter gradient, so no parameter hook fires there."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x, use_params):
        return self.linear(x) if use_params else x * 2.0


# Which ranks use the parameters in each iteration: one, the other, both, one, neither.
SKIP_SCHEDULE = [(True, False), (False, True), (True, True), (True, False), (False, False)]


def skip_batch(iteration, rank):
    g = torch.Generator().manual_seed(10 * iteration + rank)
    return torch.randn(BATCH_PER_RANK, 8, generator=g)


def skipping_rank_worker(rank, world_size, device):
    from apex.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = SkippableNet().to(device)
    ddp = DistributedDataParallel(model, message_size=1)
    grads = []
    for it, users in enumerate(SKIP_SCHEDULE):
        model.zero_grad(set_to_none=True)
        x = skip_batch(it, rank).to(device).requires_grad_(True)  # so the skipping branch still has a graph
        ddp(x, users[rank]).pow(2).mean().backward()
        grads.append({n: None if p.grad is None else p.grad.cpu() for n, p in model.named_parameters()})
    return grads


def skipping_reference(iteration, world_size):
    """The average over ranks of each rank's local gradient (zero where it skipped)."""
    torch.manual_seed(0)
    model = SkippableNet()
    total = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for rank in range(world_size):
        if SKIP_SCHEDULE[iteration][rank]:
            model.zero_grad(set_to_none=True)
            model(skip_batch(iteration, rank), True).pow(2).mean().backward()
            for n, p in model.named_parameters():
                total[n] += p.grad
    return {n: g / world_size for n, g in total.items()}


def assert_skipping_results(results):
    for it in range(len(SKIP_SCHEDULE)):
        expected = skipping_reference(it, len(results))
        for rank_grads in results:
            for name, want in expected.items():
                torch.testing.assert_close(rank_grads[it][name], want, rtol=1e-5, atol=1e-6)


def test_rank_without_parameter_gradients_still_joins_the_allreduce():
    # With parameter hooks alone, a skipping rank joins no collective in that backward:
    # here rank 0 ends up waiting for all-reduces rank 1 never issues (a collective
    # timeout), and the ones that do pair up mix different iterations' gradients.
    assert_skipping_results(run_ranks(skipping_rank_worker, 2, "cpu", timeout=60))


def reference_grads(dtype, world_size, iteration):
    model = make_model(dtype)
    loss_of(model, global_batch(iteration, world_size, dtype)).backward()
    return {n: None if p.grad is None else p.grad.float() for n, p in model.named_parameters()}


def tolerance(dtype):
    return dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def two_rank_results():
    return run_ranks(ddp_worker, 2, list(CASES), "cpu")


@pytest.mark.parametrize("case", list(CASES))
def test_ddp_gradients_match_full_batch(two_rank_results, case):
    dtype, options = CASES[case]
    scale = 2.0 if case == "sum_not_average" else 1.0
    for rank_result in two_rank_results:
        result = rank_result[case]
        for it in range(ITERATIONS):
            expected = reference_grads(dtype, 2, it)
            assert result["grads"][it]["unused.weight"] is None and expected["unused.weight"] is None
            if options.get("retain_allreduce_buffers"):
                # Grads stay local; the flat buckets hold the averages.
                assert len(result["buffers"][it]) == len(result["bucket_names"])
                for got, names in zip(result["buffers"][it], result["bucket_names"]):
                    want = torch.cat([expected[n].reshape(-1) for n in names])
                    torch.testing.assert_close(got, want, **tolerance(dtype))
                continue
            for name, ref in expected.items():
                if ref is not None:
                    torch.testing.assert_close(result["grads"][it][name], ref * scale, **tolerance(dtype))


def test_ddp_broadcasts_rank0_state(two_rank_results):
    rank0, rank1 = (r["one_bucket"]["state"] for r in two_rank_results)
    fresh = make_model(torch.float32).state_dict()
    for key, value in fresh.items():
        torch.testing.assert_close(rank0[key], value)
        torch.testing.assert_close(rank1[key], value)


def test_ddp_and_reducer_on_four_ranks():
    results = run_ranks(ddp_worker, 4, ["one_bucket", "bucket_per_param"], "cpu")
    for case in ("one_bucket", "bucket_per_param"):
        for rank_result in results:
            for it in range(ITERATIONS):
                for name, ref in reference_grads(torch.float32, 4, it).items():
                    got = rank_result[case]["grads"][it][name]
                    assert (got is None) == (ref is None)
                    if ref is not None:
                        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_reducer_averages_module_grads_and_tensor_lists():
    results = run_ranks(reducer_worker, 2)
    expected = reference_grads(torch.float32, 2, 0)
    for result in results:
        for name, grad in result["grads"].items():
            torch.testing.assert_close(grad, expected[name], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(result["tensors"][0], torch.full((3,), 0.5))
        torch.testing.assert_close(result["tensors"][1][0], torch.full((2, 2), 1.0))
