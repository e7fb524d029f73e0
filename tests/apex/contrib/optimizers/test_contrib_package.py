"""apex.contrib imports its subpackages on first use, and a missing one raises ImportError."""
from __future__ import annotations

import subprocess
import sys

import pytest

import apex.contrib


def test_optimizers_come_on_first_access():
    assert apex.contrib.optimizers.DistributedFusedAdam.__name__ == "DistributedFusedAdam"
    from apex.contrib import optimizers

    assert optimizers is apex.contrib.optimizers
    assert "optimizers" in dir(apex.contrib) and "xentropy" in dir(apex.contrib)


def test_importing_contrib_imports_no_subpackage():
    code = "import sys, apex.contrib; print(any(m.startswith('apex.contrib.') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError):
        apex.contrib.no_such_thing  # noqa: B018


def test_a_listed_subpackage_missing_from_the_build_raises_import_error(monkeypatch):
    monkeypatch.setattr(apex.contrib, "SUBPACKAGES", (*apex.contrib.SUBPACKAGES, "not_built_here"))
    with pytest.raises(ImportError, match="apex.contrib.not_built_here is not part of this apex build"):
        apex.contrib.not_built_here  # noqa: B018
    with pytest.raises(ImportError, match="not part of this apex build"):
        from apex.contrib import not_built_here  # noqa: F401
