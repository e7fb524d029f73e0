"""Fixtures of the distributed-optimizer tests: results of every case on 1, 2 and 3 ranks
(computed once per session by zero_runs) and a one-rank process group."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from zero_runs import RankResults, one_rank_process_group, run_all


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """These tensors are tiny: extra threads only fight over the machine's cores (10x slower under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    with one_rank_process_group():
        yield


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
# (ranks, device): one rank in this process, gloo ranks on the CPU, NCCL ranks on two GPUs.
SETUPS = [pytest.param((1, "cpu"), id="1rank"), pytest.param((2, "cpu"), id="2ranks"),
          pytest.param((3, "cpu"), id="3ranks"), pytest.param((2, "cuda"), id="2gpus", marks=[pytest.mark.gpu, two_gpus])]


@pytest.fixture(params=SETUPS)
def setup(request) -> tuple[int, str]:
    return request.param


@pytest.fixture
def world(setup) -> int:
    return setup[0]


@pytest.fixture
def results(setup) -> RankResults:
    world, device = setup
    return run_all(world, device, "nccl" if device == "cuda" else "gloo")
