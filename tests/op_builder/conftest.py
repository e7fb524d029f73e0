"""Fixtures for the builder tests (helpers: jit_helpers.py)."""
from pathlib import Path

import pytest

from jit_helpers import write_tiny_source


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    path = tmp_path / "cache"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def tiny_root(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    write_tiny_source(root)
    return root


@pytest.fixture
def failing_compiler(tmp_path: Path) -> str:
    """A CXX that fails loudly: a process that loads with it set certainly compiled nothing."""
    script = tmp_path / "no-compiler-allowed"
    script.write_text("#!/bin/sh\necho 'a compiler was run' >&2\nexit 1\n")
    script.chmod(0o755)
    return str(script)
