"""Shared by the distributed-optimizer tests: the cases each rank runs, and the single-process
references they must equal.

A *training* case trains a small network on each rank's slice of a global batch (real
backward passes, so the gradient hooks, overlapped reduce-scatters and all-gathers run);
its reference trains the same network on the whole global batch in one process with
torch.optim.AdamW (or apex's FusedAdam / FusedLAMB where torch has no such option). A
*manual* case sets each rank's gradients by hand (independent of the parameters, so fp16 /
bf16 runs stay comparable step by step); its reference steps on the ranks' mean gradient.

Every rank function returns CPU tensors; a case that raises returns its traceback instead,
so one broken case fails its own test only.
"""
from __future__ import annotations

import contextlib
import copy
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

STEPS = 4
LOCAL_BATCH = 3
LR = 1e-2
BETAS = (0.9, 0.99)
WEIGHT_DECAY = 0.05
# Small buckets: each network parameter set spans several buckets and most shards split a parameter.
BUCKET_MB = 2400 / 2**20
INF_STEP = 2  # the grad-scaler case puts an inf into one rank's gradients at this step

# (rtol, atol) of final parameters: float32 op-order noise, or a few roundings of bf16/fp16.
TOLERANCE = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (1.6e-2, 1.6e-2), torch.float16: (2e-3, 2e-3)}


class Net(torch.nn.Module):
    """Uneven parameter sizes (481, 37, 37, 1073, 29, 203, 7); the norm runs twice."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(13, 37)
        self.norm = torch.nn.LayerNorm(37)
        self.hidden = torch.nn.Linear(37, 29)
        self.out = torch.nn.Linear(29, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(torch.tanh(self.embed(x)))
        h = self.norm(2.0 * h)  # a module used twice: its parameters' gradients accumulate
        return self.out(torch.tanh(self.hidden(h)))


def make_net(dtype: torch.dtype = torch.float32) -> Net:
    torch.manual_seed(0)
    net = Net().to(dtype)
    with torch.no_grad():  # LayerNorm starts at (1, 0): make its parameters as generic as the others
        for p in net.norm.parameters():
            p.add_(torch.randn(p.shape).to(dtype) * 0.1)
    return net


def global_batch(step: int, micro: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + micro)
    return torch.randn(world * LOCAL_BATCH, 13, generator=g), torch.randn(world * LOCAL_BATCH, 7, generator=g)


def local_batch(step: int, micro: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = global_batch(step, micro, world)
    rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    return x[rows], y[rows]


def loss_of(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(net(x), y)


def groups_of(net: Net, decay: float) -> list[dict[str, Any]]:
    """Weight matrices with weight decay, biases and the norm without (the usual split)."""
    named = list(net.named_parameters())
    return [{"params": [p for n, p in named if n.endswith("weight") and "norm" not in n], "weight_decay": decay},
            {"params": [p for n, p in named if not (n.endswith("weight") and "norm" not in n)], "weight_decay": 0.0}]


# -- manual-gradient cases --------------------------------------------------------------------

MANUAL_SHAPES = [(37, 11), (11,), (130,), (5, 7, 3), (1,), (300,), (2, 3, 4, 5)]


def manual_params(dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(shape, generator=g).to(dtype).requires_grad_() for shape in MANUAL_SHAPES]


def manual_grads(step: int, rank: int, params: list[torch.Tensor]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return [torch.randn(p.shape, generator=g).to(p.dtype) for p in params]


def mean_grads(step: int, world: int, params: list[torch.Tensor]) -> list[torch.Tensor]:
    per_rank = [manual_grads(step, rank, params) for rank in range(world)]
    return [torch.stack([g[i].float() for g in per_rank]).mean(0) for i in range(len(params))]


# -- cases --------------------------------------------------------------------------------------

ADAM = dict(lr=LR, betas=BETAS, eps=1e-8, weight_decay=WEIGHT_DECAY)
LAMB = dict(lr=LR, betas=BETAS, eps=1e-6, weight_decay=0.01)

# name -> case. kind: "train" or "manual"; optimizer: "adam" or "lamb"; options: extra constructor
# arguments (the reference follows them, see reference_optimizer); dtype: the manual parameters';
# micro / no_sync: micro-batches per step, all but the last under no_sync(); clip: clip_grad_norm's
# max_norm; groups: weight matrices and the rest in two param groups; scaler: GradScaler with an
# inf at INF_STEP; redundant: one-rank shard groups replicated over all ranks; state_tolerance: the
# dtype whose tolerance the optimizer's parameter copy gets (16-bit scaled state); model_tolerance:
# the model's (default: the narrowest of its dtype and the gather dtype); init: init_params calls
# before the first step, (parameter slice, their sync dtypes).
CASES: dict[str, dict[str, Any]] = {
    "train_overlap": dict(kind="train", optimizer="adam", options={}),
    "train_no_overlap": dict(kind="train", optimizer="adam", options=dict(overlap_grad_sync=False)),
    "train_overlap_params": dict(kind="train", optimizer="adam", options=dict(overlap_param_sync=True)),
    "train_contiguous": dict(kind="train", optimizer="adam",
                             options=dict(contiguous_param_buffer=True, contiguous_grad_buffer=True)),
    "train_contiguous_overlap_params": dict(
        kind="train", optimizer="adam",
        options=dict(contiguous_param_buffer=True, contiguous_grad_buffer=True, overlap_param_sync=True,
                     pipeline_size=1)),
    # zero_grad(set_to_none=True): the gradients are copied into stale (never zeroed) buffer regions.
    "train_contiguous_set_to_none": dict(
        kind="train", optimizer="adam", set_to_none=True,
        options=dict(contiguous_param_buffer=True, contiguous_grad_buffer=True)),
    "train_contiguous_no_grad_overlap_set_to_none": dict(
        kind="train", optimizer="adam", set_to_none=True,
        options=dict(contiguous_grad_buffer=True, overlap_grad_sync=False, overlap_param_sync=True)),
    "train_one_bucket": dict(kind="train", optimizer="adam", options=dict(bucket_cap_mb=100.0)),
    "train_accumulate_no_sync": dict(kind="train", optimizer="adam", options={}, micro=2, no_sync=True),
    "train_accumulate_synced": dict(kind="train", optimizer="adam", options=dict(contiguous_grad_buffer=True),
                                    micro=2, no_sync=False),
    "train_accumulate_contiguous_no_sync": dict(kind="train", optimizer="adam", micro=2, no_sync=True,
                                                options=dict(contiguous_grad_buffer=True)),
    "train_accumulate_synced_set_to_none": dict(kind="train", optimizer="adam", micro=3, no_sync=False,
                                                set_to_none=True, options=dict(contiguous_grad_buffer=True)),
    "train_accumulate_contiguous_no_sync_set_to_none": dict(
        kind="train", optimizer="adam", micro=3, no_sync=True, set_to_none=True,
        options=dict(contiguous_grad_buffer=True)),
    "train_accumulate_greedy_copy_set_to_none": dict(kind="train", optimizer="adam", micro=3, no_sync=True,
                                                     greedy_grad_copy=True, set_to_none=True,
                                                     options=dict(contiguous_grad_buffer=True)),
    "train_clip": dict(kind="train", optimizer="adam", options={}, clip=0.05),
    "train_param_groups": dict(kind="train", optimizer="adam", options={}, groups=True),
    "train_sum_not_average": dict(kind="train", optimizer="adam", options=dict(average_grad_sync=False)),
    "train_lamb": dict(kind="train", optimizer="lamb", options={}, groups=True),
    "train_lamb_clip": dict(kind="train", optimizer="lamb", options=dict(max_grad_norm=0.05), groups=True),
    "train_lamb_options": dict(kind="train", optimizer="lamb", groups=True, options=dict(
        adam_w_mode=False, grad_averaging=False, bias_correction=False, use_nvlamb=True, max_grad_norm=1.0)),
    "train_lamb_contiguous": dict(kind="train", optimizer="lamb", groups=True, options=dict(
        set_param_views_to_flat_buffer=True, contiguous_grad_buffer=True, overlap_reductions=False)),
    "train_lamb_contiguous_set_to_none": dict(kind="train", optimizer="lamb", groups=True, set_to_none=True,
                                              options=dict(contiguous_grad_buffer=True, max_grad_norm=0.05)),
    "manual_fp32": dict(kind="manual", optimizer="adam", dtype=torch.float32, options={}),
    "manual_capturable": dict(kind="manual", optimizer="adam", dtype=torch.float32, options=dict(capturable=True)),
    "manual_l2_no_bias_correction": dict(kind="manual", optimizer="adam", dtype=torch.float32,
                                         options=dict(adam_w_mode=False, bias_correction=False)),
    "manual_bf16_master": dict(kind="manual", optimizer="adam", dtype=torch.bfloat16,
                               options=dict(param_sync_dtype=torch.bfloat16)),
    "manual_bf16_master_bf16_grads": dict(kind="manual", optimizer="adam", dtype=torch.bfloat16, options=dict(
        grad_sync_dtype=torch.bfloat16, param_sync_dtype=torch.bfloat16)),
    "manual_bf16_remainders": dict(kind="manual", optimizer="adam", dtype=torch.bfloat16, options=dict(
        store_params=False, store_param_remainders=True, param_sync_dtype=torch.bfloat16)),
    "manual_fp16_master": dict(kind="manual", optimizer="adam", dtype=torch.float16,
                               options=dict(param_sync_dtype=torch.float16, grad_sync_dtype=torch.float16)),
    "manual_fp32_bf16_sync_master": dict(kind="manual", optimizer="adam", dtype=torch.float32,
                                         options=dict(param_sync_dtype=torch.bfloat16)),
    "manual_scaled_bf16": dict(kind="manual", optimizer="adam", dtype=torch.float32, state_tolerance=torch.bfloat16,
                               options=dict(dtype=torch.bfloat16, with_scaled_states=True)),
    "manual_scaled_fp16": dict(kind="manual", optimizer="adam", dtype=torch.float32, state_tolerance=torch.float16,
                               options=dict(dtype=torch.float16, with_scaled_states=True)),
    "manual_grad_scaler": dict(kind="manual", optimizer="adam", dtype=torch.float32, options={}, scaler=True),
    "manual_redundant": dict(kind="manual", optimizer="adam", dtype=torch.float32, options={}, redundant=True),
    "manual_lamb_bf16": dict(kind="manual", optimizer="lamb", dtype=torch.bfloat16,
                             options=dict(param_sync_dtype=torch.bfloat16, max_grad_norm=1.0)),
    # Integer param_sync_dtype: the float32 parameters travel as raw bits, so nothing is lost.
    "manual_int64_sync": dict(kind="manual", optimizer="adam", dtype=torch.float32,
                              options=dict(param_sync_dtype=torch.int64, store_params=False)),
    "manual_int32_sync_contiguous": dict(kind="manual", optimizer="adam", dtype=torch.float32, options=dict(
        param_sync_dtype=torch.int32, store_params=False, contiguous_param_buffer=True, contiguous_grad_buffer=True)),
    # float64 parameters stepped in float32 without a master copy: each step rounds them to float32.
    "manual_fp64_params": dict(kind="manual", optimizer="adam", dtype=torch.float64, options=dict(store_params=False)),
    # Per-parameter sync dtypes: bf16 gradients for some parameters, bf16 gathers (with a master) for others.
    "manual_multi_dtypes": dict(kind="manual", optimizer="adam", dtype=torch.float32, options=dict(store_params=False),
                                state_tolerance=torch.bfloat16, model_tolerance=torch.bfloat16,
                                init=[(slice(0, None, 3), dict(grad_sync_dtype=torch.bfloat16)),
                                      (slice(1, None, 3), dict(param_sync_dtype=torch.bfloat16))]),
    "manual_multi_dtypes_contiguous": dict(
        kind="manual", optimizer="adam", dtype=torch.float32, state_tolerance=torch.bfloat16,
        model_tolerance=torch.bfloat16, options=dict(contiguous_grad_buffer=True),
        init=[(slice(0, None, 2), dict(grad_sync_dtype=torch.bfloat16, param_sync_dtype=torch.bfloat16))]),
    # Each rank clips its own gradient before the reduction (NVIDIA apex's clip_after_ar=False).
    "manual_lamb_clip_before_reduction": dict(kind="manual", optimizer="lamb", dtype=torch.float32,
                                              options=dict(max_grad_norm=1.0, clip_after_ar=False)),
    "manual_lamb_clip_before_reduction_contiguous": dict(
        kind="manual", optimizer="lamb", dtype=torch.float32, set_to_none=True,
        options=dict(max_grad_norm=1.0, clip_after_ar=False, contiguous_grad_buffer=True)),
    "manual_multi_dtypes_contiguous_set_to_none": dict(
        kind="manual", optimizer="adam", dtype=torch.float32, state_tolerance=torch.bfloat16,
        model_tolerance=torch.bfloat16, options=dict(contiguous_grad_buffer=True), set_to_none=True,
        init=[(slice(0, None, 2), dict(grad_sync_dtype=torch.bfloat16, param_sync_dtype=torch.bfloat16))]),
}


def make_optimizer(case: dict[str, Any], params: Any, device: str, **extra: Any) -> torch.optim.Optimizer:
    from apex.contrib.optimizers import DistributedFusedAdam, DistributedFusedLAMB

    options = dict(bucket_cap_mb=BUCKET_MB)
    options.update(case["options"])
    options.update(extra)
    if case["optimizer"] == "lamb":
        return DistributedFusedLAMB(params, **{**LAMB, **options})
    return DistributedFusedAdam(params, **{**ADAM, **options})


def _perturb_non_root(rank: int, params: list[torch.Tensor]) -> None:
    """Construction must broadcast rank 0's values: give the other ranks different ones."""
    if rank:
        with torch.no_grad():
            for p in params:
                p.add_(1.0)


def _train(rank: int, world: int, case: dict[str, Any], device: str) -> dict[str, Any]:
    net = make_net().to(device)
    _perturb_non_root(rank, list(net.parameters()))
    params = groups_of(net, LAMB["weight_decay"] if case["optimizer"] == "lamb" else WEIGHT_DECAY) \
        if case.get("groups") else net.parameters()
    optimizer = make_optimizer(case, params, device)
    micro, norms = case.get("micro", 1), []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=case.get("set_to_none", False))
        for m in range(micro):
            quiet = case.get("no_sync") and m < micro - 1
            greedy = case.get("greedy_grad_copy", False)
            with optimizer.no_sync(greedy_grad_copy=greedy) if quiet else contextlib.nullcontext():
                x, y = local_batch(step, m, rank, world)
                loss_of(net, x.to(device), y.to(device)).backward()
        if case.get("clip"):
            norms.append(optimizer.clip_grad_norm(case["clip"]).cpu())
        optimizer.step()
    optimizer.param_sync()
    return {"params": [p.detach().float().cpu() for p in net.parameters()], "norms": norms}


def _manual(rank: int, world: int, case: dict[str, Any], device: str) -> dict[str, Any]:
    params = [p.detach().to(device).requires_grad_() for p in manual_params(case["dtype"])]
    _perturb_non_root(rank, params)
    extra = {}
    if case.get("redundant"):  # every rank a shard group of its own; all of them replicas
        singles = [dist.new_group([r]) for r in range(world)]
        extra = dict(distributed_process_group=singles[rank], redundant_process_group=dist.group.WORLD)
    optimizer = make_optimizer(case, params, device, **extra)
    for which, dtypes in case.get("init", ()):
        optimizer.init_params(params[which], **dtypes)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=1000) if case.get("scaler") else None
    scales = []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=case.get("set_to_none", False))
        grads = manual_grads(step, rank, params)
        if scaler is not None:  # what scaler.scale(loss).backward() would give
            scales.append(float(scaler.get_scale()))
            grads = [scaler.scale(g.to(device)) for g in grads]
            if step == INF_STEP and rank == world - 1:
                grads[0][0] = float("inf")
        for p, g in zip(params, grads):
            p.grad = g.to(device)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
    state = optimizer.state_dict()
    return {"params": [p.detach().float().cpu() for p in params], "scales": scales,
            "master": [state["state"][i]["param"].float() for i in range(len(params))]}


def _set_grads(params: list[torch.Tensor], step: int, rank: int) -> None:
    for p, g in zip(params, manual_grads(step, rank, params)):
        p.grad = g.to(p.device)


def _sharded_resume(rank: int, world: int, case: dict[str, Any], device: str) -> dict[str, Any]:
    """Train half, save this rank's shards, go on; then restart from the saved half in a fresh
    optimizer and train the second half again: both ends must be the same bits."""
    params = [p.detach().to(device).requires_grad_() for p in manual_params(case["dtype"])]
    optimizer = make_optimizer(case, params, device)
    for step in range(STEPS):
        if step == STEPS // 2:
            saved_params = [p.detach().clone() for p in params]
            saved = copy.deepcopy(optimizer.state_dict(gather_on_root=False))
        _set_grads(params, step, rank)
        optimizer.step()
    uninterrupted = [p.detach().float().cpu().clone() for p in params]
    with torch.no_grad():
        for p, value in zip(params, saved_params):
            p.copy_(value)
    resumed = make_optimizer(case, params, device)
    resumed.load_state_dict(saved)
    for step in range(STEPS // 2, STEPS):
        _set_grads(params, step, rank)
        resumed.step()
    return {"params": [p.detach().float().cpu() for p in params], "uninterrupted": uninterrupted}


def _gathered_resume(rank: int, world: int, case: dict[str, Any], device: str, checkpoint: dict) -> dict[str, Any]:
    """Load a gathered checkpoint (saved on other ranks, or by FusedAdam) with its parameter
    values, train the second half."""
    # Copies: spawned ranks receive tensors in memory shared with the caller.
    params = [value.detach().to(device, copy=True).requires_grad_() for value in checkpoint["params"]]
    optimizer = make_optimizer(case, params, device)
    optimizer.load_state_dict(checkpoint["optimizer"])
    for step in range(STEPS // 2, STEPS):
        _set_grads(params, step, rank)
        optimizer.step()
    return {"params": [p.detach().float().cpu() for p in params], "step": int(optimizer.state["step"])}


def _save_gathered(rank: int, world: int, case: dict[str, Any], device: str) -> dict[str, Any]:
    """Train the first half, save a gathered checkpoint (on the root only), train the second half."""
    params = [p.detach().to(device).requires_grad_() for p in manual_params(case["dtype"])]
    optimizer = make_optimizer(case, params, device)
    for step in range(STEPS):
        if step == STEPS // 2:
            checkpoint = {"params": [p.detach().cpu().clone() for p in params],
                          "optimizer": optimizer.state_dict(gather_on_root=True)}
            everywhere = optimizer.state_dict()
        _set_grads(params, step, rank)
        optimizer.step()
    return {"params": [p.detach().float().cpu() for p in params], "checkpoint": checkpoint,
            "everywhere": everywhere}


RUNNERS = {"train": _train, "manual": _manual}


def rank_worker(rank: int, world: int, jobs: list[tuple[str, str, tuple]], device: str) -> dict[str, Any]:
    """Run ``jobs`` = [(result name, what, args)]: what is a case kind ("train"/"manual", args
    = (case name,)) or a checkpoint flow ("sharded_resume", "save_gathered", "gathered_resume")."""
    flows = {"sharded_resume": _sharded_resume, "save_gathered": _save_gathered, "gathered_resume": _gathered_resume}
    results = {}
    for name, what, args in jobs:
        try:
            case = CASES[args[0]]
            run = RUNNERS[case["kind"]] if what == "case" else flows[what]
            results[name] = run(rank, world, case, device, *args[1:])
        except Exception:  # reported by the test of this job, not by every test
            results[name] = {"error": traceback.format_exc()}
    return results


def result_of(results: list[dict[str, Any]], name: str, rank: int = 0) -> dict[str, Any]:
    """Job ``name``'s result on ``rank``; fails with the rank's traceback when it raised."""
    for r, per_rank in enumerate(results):
        if "error" in per_rank[name]:
            raise AssertionError(f"rank {r} raised:\n{per_rank[name]['error']}")
    return results[rank][name]


# -- references ---------------------------------------------------------------------------------

def reference_optimizer(case: dict[str, Any], params: Any) -> torch.optim.Optimizer:
    """The single-process optimizer a case must equal: torch's AdamW / Adam where it has the
    options, apex's FusedAdam / FusedLAMB otherwise."""
    from apex.optimizers import FusedAdam, FusedLAMB

    options = case["options"]
    if case["optimizer"] == "lamb":
        max_norm = options.get("max_grad_norm", 0.0)
        return FusedLAMB(params, **LAMB, max_grad_norm=max_norm if max_norm > 0 else float("inf"),
                         adam_w_mode=options.get("adam_w_mode", True),
                         grad_averaging=options.get("grad_averaging", True),
                         bias_correction=options.get("bias_correction", True),
                         use_nvlamb=options.get("use_nvlamb", False))
    if not options.get("bias_correction", True):
        return FusedAdam(params, **ADAM, adam_w_mode=options.get("adam_w_mode", True), bias_correction=False)
    if options.get("adam_w_mode", True):
        return torch.optim.AdamW(params, **ADAM)
    return torch.optim.Adam(params, **ADAM)


def reference_train(case: dict[str, Any], world: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Final parameters (and clipped norms) of one process training on the global batches."""
    net = make_net()
    params = groups_of(net, LAMB["weight_decay"] if case["optimizer"] == "lamb" else WEIGHT_DECAY) \
        if case.get("groups") else net.parameters()
    optimizer = reference_optimizer(case, params)
    scale = float(world) if case["options"].get("average_grad_sync") is False else 1.0
    micro, norms = case.get("micro", 1), []
    for step in range(STEPS):
        optimizer.zero_grad()
        for m in range(micro):
            x, y = global_batch(step, m, world)
            (loss_of(net, x, y) * scale).backward()
        if case.get("clip"):
            norms.append(torch.nn.utils.clip_grad_norm_(net.parameters(), case["clip"]))
        optimizer.step()
    return [p.detach() for p in net.parameters()], norms


def reference_manual(case: dict[str, Any], worlds: list[int], masters: list[torch.Tensor] | None = None,
                     state: dict | None = None, first_step: int = 0,
                     optimizer_class: type | None = None) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    """float32 masters after stepping on the ranks' mean gradients, ``worlds[i]`` ranks at step
    ``first_step + i`` (from ``masters`` and optimizer ``state`` when given; the grad-scaler case
    skips its inf step), with the case's reference optimizer or ``optimizer_class(masters, **ADAM)``."""
    model_params = manual_params(case["dtype"])
    masters = [p.detach().float().clone().requires_grad_() for p in (masters or model_params)]
    optimizer = optimizer_class(masters, **ADAM) if optimizer_class else reference_optimizer(case, masters)
    if state is not None:
        optimizer.load_state_dict(state)
    for step, world in enumerate(worlds, start=first_step):
        if case.get("scaler") and step == INF_STEP:
            continue
        for master, grad in zip(masters, mean_grads(step, world, model_params)):
            master.grad = grad
        optimizer.step()
    return [m.detach() for m in masters], optimizer


# On a GPU the forward/backward sums in another order than the CPU reference: float32 gets more room.
GPU_FLOAT32_TOLERANCE = (1e-4, 1e-4)


def assert_close(actual: list[torch.Tensor], expected: list[torch.Tensor], dtype: torch.dtype,
                 device: str = "cpu") -> None:
    rtol, atol = GPU_FLOAT32_TOLERANCE if device == "cuda" and dtype == torch.float32 else TOLERANCE[dtype]
    assert len(actual) == len(expected)
    for index, (a, e) in enumerate(zip(actual, expected)):
        torch.testing.assert_close(a.float(), e.float(), rtol=rtol, atol=atol, msg=lambda m: f"param {index}: {m}")
