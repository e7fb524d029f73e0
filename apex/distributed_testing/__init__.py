"""apex.distributed_testing: a base class for tests that run one process per rank (NVIDIA apex's).

    from apex.distributed_testing.distributed_test_base import NcclDistributedTestBase

    class TestMyCollective(NcclDistributedTestBase):
        def test_sum(self):                  # runs in every rank, the process group initialized
            x = torch.ones(1, device="cuda")
            torch.distributed.all_reduce(x)
            self.assertEqual(x.item(), self.world_size)

``DistributedTestBase`` (``torch.testing._internal.common_distributed.MultiProcessTestCase``)
spawns ``world_size`` processes per test; each initializes the process group with the class's
``DISTRIBUTED_BACKEND`` through a file store, runs the test method and tears the group down.
``NcclDistributedTestBase`` (one GPU per rank), ``UccDistributedTestBase`` and
``GlooDistributedTestBase`` (CPU ranks, no GPU needed) pick the backend.

Importing this package needs neither a GPU nor torch's test dependencies; the classes are
loaded on first access (torch's test harness needs the ``expecttest`` package).
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DistributedTestBase": "distributed_test_base",
    "NcclDistributedTestBase": "distributed_test_base",
    "UccDistributedTestBase": "distributed_test_base",
    "GlooDistributedTestBase": "distributed_test_base",
    "HAS_UCC": "_ucc_util",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
