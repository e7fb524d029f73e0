"""Test-wide configuration: the `gpu` marker skips without CUDA; op builds are announced live."""
import sys

import pytest
import torch

from apex.op_builder import notice


def pytest_configure(config):
    # A first-use op build takes minutes; its "compiling op X" notice must not wait in pytest's
    # captured output (`make test` looked hung), so it goes straight to the terminal.
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        return

    def show(line: str) -> None:
        with capture.global_and_fixture_disabled():
            sys.stderr.write(f"\n{line}\n")
            sys.stderr.flush()

    notice.set_writer(show)


def pytest_unconfigure(config):
    notice.set_writer(None)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run `make test-gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
