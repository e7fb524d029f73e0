"""One process per rank, each with an initialized process group: the base of apex's distributed tests.

A test class derives from one of the classes below and writes ordinary ``test_*`` methods. For
each test the parent process spawns ``world_size`` processes (``MultiProcessTestCase``); every
rank initializes torch.distributed with the class's ``DISTRIBUTED_BACKEND`` through a file store,
binds its device, meets the others at a barrier, runs the method, meets them again and destroys
the process group. A failure or ``skipTest`` in any rank is reported by the parent as usual.

What a subclass chooses:

- ``DISTRIBUTED_BACKEND``: "nccl", "gloo", "ucc", ... (required);
- ``DEVICE_TYPE``: "cuda" (default; rank ``r`` uses GPU ``r % device_count``) or "cpu";
- ``world_size`` (a property): by default one rank per GPU, at most ``MAX_WORLD_SIZE`` (4),
  or ``CPU_WORLD_SIZE`` (2) ranks for CPU tests;
- ``init_method``: the file store of the test (a property to override, as UCC does).

A test is skipped, not failed, when what it needs is missing: CUDA for a CUDA test, the backend
in this torch build. Importing this module needs no GPU.
"""
from __future__ import annotations

import os
import socket
import sys
import unittest

import torch
from torch import distributed as dist
from torch.testing._internal import common_distributed, common_utils

from apex.distributed_testing._ucc_util import HAS_UCC

__all__ = ["DistributedTestBase", "NcclDistributedTestBase", "UccDistributedTestBase", "GlooDistributedTestBase"]

# torch_ucc hangs on NVIDIA drivers older than this (openucx/ucc#496).
_UCC_MIN_DRIVER = (470, 42, 1)


def _backend_available(backend: str) -> bool:
    if backend == "ucc":
        return HAS_UCC
    is_available = getattr(dist, "is_backend_available", None)
    if is_available is not None:
        return is_available(backend)
    return getattr(dist, f"is_{backend}_available", lambda: True)()


class DistributedTestBase(common_distributed.MultiProcessTestCase):
    """Runs each test method in ``world_size`` processes with torch.distributed initialized."""

    DEVICE_TYPE: str = "cuda"
    MAX_WORLD_SIZE: int = 4
    CPU_WORLD_SIZE: int = 2

    def setUp(self) -> None:
        # Checked before the base class creates the store file: a setUp that raises gets no tearDown.
        reason = self._skip_reason()
        if reason is not None:
            raise unittest.SkipTest(reason)
        super().setUp()
        self._setup_pre_spawn()
        self._spawn_processes()

    def tearDown(self) -> None:
        torch.cuda.empty_cache()  # a no-op unless this process initialized CUDA
        super().tearDown()

    def _skip_reason(self) -> str | None:
        """Why this test cannot run here (None: it can)."""
        backend = getattr(self, "DISTRIBUTED_BACKEND", None)
        if backend is None:
            raise TypeError(f"{type(self).__name__} must set DISTRIBUTED_BACKEND (e.g. 'nccl' or 'gloo')")
        if not dist.is_available():
            return "torch.distributed is not available in this torch build"
        if self.DEVICE_TYPE == "cuda" and not torch.cuda.is_available():
            return f"needs CUDA ({backend} ranks run one per GPU)"
        if not _backend_available(backend):
            return f"the {backend} backend is not available in this torch build"
        if self.world_size < 1:
            return "no device to run a rank on"
        return None

    @property
    def world_size(self) -> int:
        if self.DEVICE_TYPE == "cuda":
            return min(torch.cuda.device_count(), self.MAX_WORLD_SIZE)
        return self.CPU_WORLD_SIZE

    @property
    def init_method(self) -> str:
        return f"{common_utils.FILE_SCHEMA}{self.file_name}"

    @property
    def destroy_pg_upon_exit(self) -> bool:
        return False  # _run destroys the group itself, after the closing barrier

    @property
    def device(self) -> torch.device:
        """This rank's device (set once the rank runs)."""
        if self.DEVICE_TYPE == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device(self.DEVICE_TYPE)

    @classmethod
    def _run(cls, rank: int, test_name: str, file_name: str, pipe, **kwargs) -> None:
        """A rank's process: set up the device and the process group, run the test, tear down."""
        self = cls(test_name)
        self.rank = rank
        self.file_name = file_name
        if self.DEVICE_TYPE == "cuda":
            if not torch.cuda.is_available():
                sys.exit(common_distributed.TEST_SKIPS["no_cuda"].exit_code)
            torch.cuda.set_device(rank % torch.cuda.device_count())
        try:
            dist.init_process_group(backend=self.DISTRIBUTED_BACKEND, init_method=self.init_method,
                                    world_size=int(self.world_size), rank=rank)
        except RuntimeError as error:
            if "recompile" in str(error):  # torch was built without this backend
                sys.exit(common_distributed.TEST_SKIPS["backend_unavailable"].exit_code)
            raise
        self._barrier()
        self.run_test(test_name, pipe)  # exits the process itself when the test fails or skips
        self._barrier()
        dist.destroy_process_group()
        sys.exit(0)

    def _barrier(self) -> None:
        if self.DISTRIBUTED_BACKEND == "nccl":
            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()

    def _setup_pre_spawn(self) -> None:
        """Runs in the parent process before the ranks are spawned (environment for them)."""


class NcclDistributedTestBase(DistributedTestBase):
    """One rank per GPU (at most four), NCCL."""

    DISTRIBUTED_BACKEND = "nccl"


class GlooDistributedTestBase(DistributedTestBase):
    """``CPU_WORLD_SIZE`` CPU ranks, gloo: runs anywhere, no GPU needed."""

    DISTRIBUTED_BACKEND = "gloo"
    DEVICE_TYPE = "cpu"


def _driver_version() -> tuple[int, ...] | None:
    from torch.utils import collect_env  # runs nvidia-smi: only asked for UCC tests

    version = collect_env.get_nvidia_driver_version(collect_env.run)
    try:
        return tuple(int(part) for part in version.split("."))
    except (AttributeError, ValueError):
        return None


def _free_port() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("localhost", 0))
        return str(sock.getsockname()[1])


@unittest.skipUnless(HAS_UCC, "needs torch built with UCC, or the torch_ucc plugin")
class UccDistributedTestBase(DistributedTestBase):
    """One rank per GPU, UCC over TCP rendezvous (``MASTER_ADDR``/``MASTER_PORT``; UCX_TLS
    defaults to "tcp,cuda"). Skipped without UCC and on NVIDIA drivers older than 470.42.01."""

    DISTRIBUTED_BACKEND = "ucc"

    def _skip_reason(self) -> str | None:
        reason = super()._skip_reason()
        if reason is None:
            driver = _driver_version()
            if driver is None or driver < _UCC_MIN_DRIVER:
                reason = (f"torch_ucc needs NVIDIA driver >= {'.'.join(map(str, _UCC_MIN_DRIVER))}, found "
                          f"{'.'.join(map(str, driver)) if driver else 'none'} (openucx/ucc#496)")
        return reason

    def _setup_pre_spawn(self) -> None:
        self._saved_environ = {key: os.environ.get(key) for key in ("MASTER_ADDR", "MASTER_PORT", "UCX_TLS")}
        os.environ["MASTER_ADDR"] = "localhost"
        os.environ.setdefault("MASTER_PORT", _free_port())
        os.environ.setdefault("UCX_TLS", "tcp,cuda")
        self.master_addr, self.master_port = "localhost", os.environ["MASTER_PORT"]

    def tearDown(self) -> None:
        super().tearDown()
        for key, value in getattr(self, "_saved_environ", {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    @property
    def init_method(self) -> str:
        return f"tcp://localhost:{os.environ['MASTER_PORT']}"
