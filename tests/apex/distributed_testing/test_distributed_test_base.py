"""apex.distributed_testing: the base class really spawns the ranks, initializes the process
group and reports each rank's failure or skip; GPU backends skip cleanly on a CPU machine, and
importing the package needs neither a GPU nor torch's test dependencies."""
from __future__ import annotations

import subprocess
import sys
import unittest

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("expecttest", reason="torch's multi-process test harness needs the expecttest package")

import apex  # noqa: E402
from apex.distributed_testing import distributed_test_base as base  # noqa: E402


class TestGlooRanks(base.GlooDistributedTestBase):
    """Collected by pytest: each test runs in two CPU processes."""

    def test_each_rank_has_an_initialized_group_and_runs_a_collective(self):
        self.assertTrue(dist.is_initialized())
        self.assertEqual(dist.get_backend(), "gloo")
        self.assertEqual((dist.get_rank(), dist.get_world_size()), (self.rank, self.world_size))
        self.assertEqual(self.device, torch.device("cpu"))
        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        self.assertEqual(value.item(), sum(range(1, self.world_size + 1)))
        gathered = [torch.zeros(1) for _ in range(self.world_size)]
        dist.all_gather(gathered, torch.tensor([float(self.rank)]))
        self.assertEqual([t.item() for t in gathered], list(range(self.world_size)))


@pytest.mark.gpu
class TestNcclRanks(base.NcclDistributedTestBase):
    """One rank per GPU (skipped by the base class without CUDA)."""

    def test_each_rank_owns_a_gpu_and_reduces_on_it(self):
        self.assertEqual(dist.get_backend(), "nccl")
        self.assertEqual(self.device, torch.device("cuda", self.rank % torch.cuda.device_count()))
        value = torch.full((1,), float(self.rank + 1), device=self.device)
        dist.all_reduce(value)
        self.assertEqual(value.item(), sum(range(1, self.world_size + 1)))


class _Ranks(base.GlooDistributedTestBase):
    """Not collected (``__test__``): run below through unittest, to look at what the parent reports."""

    __test__ = False

    def test_fails_in_one_rank(self):
        if self.rank == 1:
            raise ValueError("rank 1 is broken")
        dist.barrier()

    def test_skips(self):
        self.skipTest("nothing to do here")


class _ThreeRanks(_Ranks):
    __test__ = False
    CPU_WORLD_SIZE = 3


class _OnGpus(base.NcclDistributedTestBase):
    __test__ = False

    def test_anything(self):
        pass


class _OnUcc(base.UccDistributedTestBase):
    __test__ = False

    def test_anything(self):
        pass


class _NoBackend(base.DistributedTestBase):
    __test__ = False

    def test_anything(self):
        pass


def _run(case: type, name: str) -> unittest.TestResult:
    result = unittest.TestResult()
    case(name).run(result)
    return result


def test_the_parent_reports_a_failing_rank_with_its_traceback():
    result = _run(_Ranks, "test_fails_in_one_rank")
    assert len(result.errors) == 1 and not result.failures
    assert "Process 1" in result.errors[0][1] and "rank 1 is broken" in result.errors[0][1]


def test_a_skip_in_the_ranks_is_a_skip():
    result = _run(_Ranks, "test_skips")
    assert len(result.skipped) == 1 and result.wasSuccessful() and not result.errors


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip on a machine without CUDA")
def test_gpu_backends_skip_without_cuda():
    result = _run(_OnGpus, "test_anything")
    assert len(result.skipped) == 1 and "needs CUDA" in result.skipped[0][1]
    assert _OnGpus("test_anything").world_size == 0


def test_ucc_skips_without_ucc_or_cuda():
    if base.HAS_UCC and torch.cuda.is_available():
        pytest.skip("UCC and CUDA are both here")
    result = _run(_OnUcc, "test_anything")
    assert len(result.skipped) == 1


def test_a_class_without_a_backend_is_an_error():
    result = _run(_NoBackend, "test_anything")
    assert len(result.errors) == 1 and "DISTRIBUTED_BACKEND" in result.errors[0][1]


def test_world_size_defaults():
    assert _ThreeRanks("test_skips").world_size == 3
    assert TestGlooRanks("test_each_rank_has_an_initialized_group_and_runs_a_collective").world_size == 2
    assert base.NcclDistributedTestBase.DISTRIBUTED_BACKEND == "nccl"
    assert base.UccDistributedTestBase.DISTRIBUTED_BACKEND == "ucc"


def test_import_needs_no_gpu_and_no_test_dependencies():
    """The package and HAS_UCC import without expecttest (which the classes' torch harness needs)."""
    code = ("import sys; sys.modules['expecttest'] = None\n"
            "import apex\n"
            "print(apex.distributed_testing.HAS_UCC in (True, False),\n"
            "      'torch.testing._internal.common_distributed' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=apex.__path__[0] + "/..")
    assert out.stdout.split() == ["True", "False"]
    assert set(apex.distributed_testing.__all__) == {
        "DistributedTestBase", "NcclDistributedTestBase", "UccDistributedTestBase", "GlooDistributedTestBase",
        "HAS_UCC"}
    assert apex.distributed_testing.NcclDistributedTestBase is base.NcclDistributedTestBase
