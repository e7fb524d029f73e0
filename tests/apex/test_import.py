"""`import apex`: every subpackage is reachable as an attribute, imported only when first touched;
importing apex imports neither torch nor any subpackage. The top-level helpers of NVIDIA and ROCm
apex are there."""
import subprocess
import sys
import warnings

import pytest
import torch

import apex

PRESENT = [name for name in apex._SUBPACKAGES if apex._is_present(name)]


def python(code):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=apex.__path__[0] + "/..")
    return result.stdout.strip()


def test_import_apex_imports_nothing_else():
    loaded = python("import sys, apex; print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('apex')))")
    assert loaded == "['apex']"


def test_subpackages_are_attributes():
    for name in ("amp", "optimizers", "normalization", "parallel", "fp16_utils", "multi_tensor_apply", "testing"):
        assert name in PRESENT
    imported = python("import apex, sys\n"
                      f"for name in {PRESENT!r}: assert getattr(apex, name) is sys.modules['apex.' + name], name\n"
                      "print(apex.optimizers.FusedAdam.__name__)")
    assert imported == "FusedAdam"
    assert set(apex._SUBPACKAGES) <= set(dir(apex))
    assert set(PRESENT) <= set(apex.__all__)


def test_a_subpackage_not_installed_is_a_clean_attribute_error(monkeypatch):
    monkeypatch.setattr(apex, "_SUBPACKAGES", apex._SUBPACKAGES + ("no_such_subpackage",))
    assert not hasattr(apex, "no_such_subpackage")
    with pytest.raises(AttributeError, match="apex.no_such_subpackage is not part of this installation"):
        apex.no_such_subpackage
    with pytest.raises(AttributeError, match="has no attribute 'not_a_subpackage'"):
        apex.not_a_subpackage


def test_a_broken_subpackage_is_not_hidden(tmp_path, monkeypatch):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "__init__.py").write_text("import a_dependency_that_is_missing\n")
    monkeypatch.setattr(apex, "__path__", apex.__path__ + [str(tmp_path)])
    monkeypatch.setattr(apex, "_SUBPACKAGES", apex._SUBPACKAGES + ("broken",))
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_is_missing"):
        apex.broken
    sys.modules.pop("apex.broken", None)


def test_star_import():
    namespace = {}
    exec("from apex import *", namespace)
    assert "amp" in namespace and "deprecated_warning" in namespace


def test_top_level_helpers():
    assert apex.check_if_rocm_pytorch() == (torch.version.hip is not None) == apex.IS_ROCM_PYTORCH
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert apex.check_cudnn_version_and_warn("some_option", 10**9) is apex.IS_ROCM_PYTORCH
    assert apex.IS_ROCM_PYTORCH or "`some_option` depends on cuDNN 1000000000 or later" in str(caught[0].message)
    with pytest.warns(apex.DeprecatedFeatureWarning, match="going away"):
        apex.deprecated_warning("going away")
    assert issubclass(apex.DeprecatedFeatureWarning, FutureWarning)
