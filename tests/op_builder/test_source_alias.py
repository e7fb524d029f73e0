"""`apex.op_builder` is the builder's name; in the source tree the old `op_builder` is the very same
modules (one registry, one load table, one OpBuildError), never a second copy."""
import importlib
import os

import pytest

import apex.op_builder
from jit_helpers import REPO, import_path

from_checkout = str(REPO) in import_path().split(os.pathsep)


@pytest.mark.skipif(not from_checkout, reason="the old name exists in the source tree only")
@pytest.mark.parametrize("submodule", ["", ".jit", ".errors", ".registry", ".cache", ".builder", ".ops.apex_c"])
def test_the_old_name_gives_the_same_module_objects(submodule):
    old = importlib.import_module("op_builder" + submodule)
    assert old is importlib.import_module("apex.op_builder" + submodule)
    assert old.__spec__.name == "apex.op_builder" + submodule


@pytest.mark.skipif(not from_checkout, reason="the old name exists in the source tree only")
def test_classes_and_state_are_shared():
    from op_builder import OpBuildError, load_op
    from op_builder.registry import all_builders

    assert OpBuildError is apex.op_builder.OpBuildError and load_op is apex.op_builder.load_op
    assert all_builders() is apex.op_builder.all_builders()  # one (cached) registry


def test_apex_reaches_the_builder_as_an_attribute():
    import apex

    assert apex.op_builder.__name__ == "apex.op_builder" and callable(apex.op_builder.load_op)
