"""ninja is found where a venv's pip put it, whether or not the venv is activated.

`make test PYTHON=.venv/bin/python` on a machine without system ninja used to fail 459 tests with
"ninja is not installed" although `import ninja` worked.
"""
import os
import sys
import types
from pathlib import Path

import pytest

from apex.op_builder import toolchain
from apex.op_builder.builder import CppOpBuilder
from apex.op_builder.compiler import child_env
from apex.op_builder.plan import Purpose, plan_build


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho 1.11.1\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def no_ninja_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "ninja", None)  # `import ninja` fails


def test_ninja_on_path_wins(tmp_path, monkeypatch):
    on_path = _executable(tmp_path / "bin" / "ninja")
    assert toolchain.ninja({"PATH": str(on_path.parent)}) == str(on_path)


def test_ninja_beside_the_python_of_an_unactivated_venv(tmp_path, monkeypatch, no_ninja_package):
    venv_ninja = _executable(tmp_path / "venv" / "bin" / "ninja")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    env = {"PATH": str(tmp_path / "empty")}
    assert toolchain.ninja(env) == str(venv_ninja)
    # torch's extension builder runs plain `ninja`: the build's PATH gets its folder first.
    assert toolchain.build_path(env).split(os.pathsep)[0] == str(venv_ninja.parent)


def test_ninja_through_the_ninja_package(tmp_path, monkeypatch):
    packaged = _executable(tmp_path / "site" / "ninja" / "data" / "bin" / "ninja")
    monkeypatch.setitem(sys.modules, "ninja", types.SimpleNamespace(BIN_DIR=str(packaged.parent)))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "elsewhere" / "python"))
    assert toolchain.ninja({"PATH": str(tmp_path / "empty")}) == str(packaged)


def test_no_ninja_anywhere_is_none(tmp_path, monkeypatch, no_ninja_package):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert toolchain.ninja({"PATH": str(tmp_path)}) is None


def test_the_build_child_gets_ninja_on_its_path(tmp_path, monkeypatch, tiny_root):
    """PATH without ninja, ninja only beside sys.executable: the build child's PATH finds it."""
    real_ninja = toolchain.ninja()
    if real_ninja is None:
        pytest.skip("no ninja on this machine")
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "ninja").symlink_to(real_ninja)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                               if not (Path(p) / "ninja").exists()))

    class Tiny(CppOpBuilder):
        NAME = "tiny_op"
        SOURCE_DIR = "tiny"

    env = child_env(plan_build(Tiny(source_root=tiny_root), Purpose.CHECK))
    assert toolchain.ninja(env) is not None and env["PATH"].startswith(str(venv_bin))
