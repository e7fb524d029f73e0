"""Runs every distributed case once per session, on one rank in this process and on 2 and 3
gloo ranks (each spawn costs seconds); the tests then compare the results with
single-process references. The multi-rank runs use tests/apex/parallel's harness (run_ranks)."""
from __future__ import annotations

import contextlib
import pathlib
import sys
from collections.abc import Iterator

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "parallel"))

import zero_testing as zt  # noqa: E402
from parallel_harness import COLLECTIVE_TIMEOUT, free_port, run_ranks  # noqa: E402

# Checkpoint flows: (result name, flow, case).
SHARDED_RESUMES = {f"sharded_resume_{case}": case for case in
                   ("manual_fp32", "manual_bf16_master", "manual_bf16_remainders", "manual_scaled_bf16",
                    "manual_lamb_bf16")}
SAVES = {"save_gathered_fp32": "manual_fp32", "save_gathered_bf16_master": "manual_bf16_master",
         "save_gathered_remainders": "manual_bf16_remainders", "save_gathered_lamb": "manual_lamb_bf16"}


def single_process_checkpoint(world: int, optimizer_class: type) -> dict:
    """``optimizer_class`` on one process after the first half of the manual fp32 case (mean of `world` ranks' grads)."""
    masters, optimizer = zt.reference_manual(zt.CASES["manual_fp32"], [world] * (zt.STEPS // 2),
                                             optimizer_class=optimizer_class)
    return {"params": masters, "optimizer": optimizer.state_dict()}


def _jobs(world: int, checkpoints: dict[str, dict]) -> list[tuple[str, str, tuple]]:
    jobs = [(name, "case", (name,)) for name in zt.CASES]
    jobs += [(name, "sharded_resume", (case,)) for name, case in SHARDED_RESUMES.items()]
    jobs += [(name, "save_gathered", (case,)) for name, case in SAVES.items()]
    jobs += [(name, "gathered_resume", (case, checkpoint)) for name, (case, checkpoint) in checkpoints.items()]
    return jobs


class RankResults(list):
    """Each rank's results (by rank), and the device they ran on."""

    def __init__(self, per_rank: list, device: str) -> None:
        super().__init__(per_rank)
        self.device = device


_RESULTS: dict[tuple[int, str], RankResults] = {}


def run_all(world: int, device: str = "cpu", backend: str = "gloo") -> RankResults:
    """Every job's results on `world` ranks, computed once per session. The 3-rank run also
    resumes the 2-rank run's gathered checkpoints; every run resumes a FusedAdam one."""
    key = (world, device)
    if key not in _RESULTS:
        from apex.op_builder import load_op

        load_op("amp_C")  # compiled here first: a first-use build must not eat the ranks' deadline
        from apex.optimizers import FusedAdam

        checkpoints = {"from_fused_adam": ("manual_fp32", single_process_checkpoint(world, FusedAdam)),
                       "from_torch_adamw": ("manual_fp32", single_process_checkpoint(world, torch.optim.AdamW))}
        if world == 3:
            two = run_all(2, device, backend)
            for name, case in SAVES.items():
                checkpoints[f"from_two_ranks_{case}"] = (case, zt.result_of(two, name)["checkpoint"])
        jobs = _jobs(world, checkpoints)
        if world == 1:
            per_rank = [in_process(zt.rank_worker, jobs, device)]
        else:
            per_rank = run_ranks(zt.rank_worker, world, jobs, device, backend=backend, timeout=600.0)
        _RESULTS[key] = RankResults(per_rank, device)
    return _RESULTS[key]


@contextlib.contextmanager
def one_rank_process_group() -> Iterator[None]:
    """A one-rank gloo process group in this process, gone afterwards (other tests expect none)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=COLLECTIVE_TIMEOUT)
    try:
        yield
    finally:
        dist.destroy_process_group()


def in_process(fn, *args):
    """``fn(0, 1, *args)`` on a one-rank group in this process."""
    with one_rank_process_group():
        return fn(0, 1, *args)
