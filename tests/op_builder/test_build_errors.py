"""A failed build raises OpBuildError naming the op, the file:line, the command, the log, and a hint."""
import pytest

from op_builder import toolchain
from op_builder.builder import CppOpBuilder
from op_builder.errors import OpBuildError, first_error_lines
from op_builder.jit import load_builder
from jit_helpers import write_tiny_source

BROKEN = """
#include <Python.h>
int this_is_fine = 1;
static PyObject* broken(PyObject*, PyObject*) { return undeclared_identifier; }
"""


class Tiny(CppOpBuilder):
    NAME = "tiny_op"
    CPP_SOURCES = ["tiny/tiny.cpp"]


def test_broken_source_reports_file_line_command_and_log(cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("APEX_CACHE_DIR", str(cache_dir))
    source = write_tiny_source(tmp_path / "src", body=BROKEN)
    with pytest.raises(OpBuildError) as caught:
        load_builder(Tiny(source_root=tmp_path / "src"))
    message = str(caught.value)
    assert "apex could not build op 'tiny_op': compilation failed" in message
    assert f"{source}:4:" in message and "undeclared_identifier" in message
    assert "failing command:" in message and "tiny.cpp" in message
    assert caught.value.log_path.is_file()
    assert "ninja -v returned non-zero exit status" not in message.splitlines()[0]


def test_missing_compiler_gives_the_hint(cache_dir, tiny_root, monkeypatch):
    monkeypatch.setenv("APEX_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(OpBuildError, match="no C\\+\\+ compiler found") as caught:
        load_builder(Tiny(source_root=tiny_root))
    assert "hint: install g++" in str(caught.value)


def test_missing_ninja_gives_the_hint(cache_dir, tiny_root, monkeypatch):
    monkeypatch.setenv("APEX_CACHE_DIR", str(cache_dir))
    monkeypatch.setattr(toolchain, "ninja", lambda env=None: None)
    with pytest.raises(OpBuildError, match="ninja is not installed") as caught:
        load_builder(Tiny(source_root=tiny_root))
    assert "pip install ninja" in str(caught.value)


def test_missing_nvcc_gives_the_hint(tmp_path):
    env = {"PATH": str(tmp_path), "CUDA_HOME": str(tmp_path / "no-cuda"), "CXX": "/bin/sh"}
    (tmp_path / "ninja").write_text("#!/bin/sh\n")
    (tmp_path / "ninja").chmod(0o755)
    with pytest.raises(OpBuildError, match="CUDA toolkit \\(nvcc\\) was not found") as caught:
        toolchain.check("some_cuda_op", with_cuda=True, env=env)
    assert "set CUDA_HOME" in str(caught.value)


def test_nvcc_torch_cuda_mismatch_gives_the_hint(tmp_path, monkeypatch):
    import torch

    fake_home = tmp_path / "cuda"
    (fake_home / "bin").mkdir(parents=True)
    fake_nvcc = fake_home / "bin" / "nvcc"
    fake_nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 11.8, V11.8.89'\n")
    fake_nvcc.chmod(0o755)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.version, "hip", None)
    env = {"PATH": "/usr/bin:/bin", "CUDA_HOME": str(fake_home), "CXX": "/bin/sh"}
    monkeypatch.setattr(toolchain, "ninja", lambda env=None: "/usr/bin/ninja")
    with pytest.raises(OpBuildError, match="nvcc is CUDA 11.8 but torch was built with CUDA 13.0") as caught:
        toolchain.check("some_cuda_op", with_cuda=True, env=env)
    assert "install a CUDA 13.x toolkit" in str(caught.value)


def test_error_parser_reads_gcc_nvcc_and_linker_lines():
    log = "\n".join([
        "[1/2] c++ -c a.cpp",
        "FAILED: a.o",
        "c++ -c a.cpp -o a.o",
        "/src/a.cpp:12:5: error: 'x' was not declared in this scope",
        "   12 |     x = 1;",
        "/src/k.cu(7): error: identifier \"y\" is undefined",
        "a.so: undefined symbol: _Z3foov",
        "ninja: build stopped: subcommand failed.",
    ])
    lines = first_error_lines(log)
    assert "/src/a.cpp:12:5: error" in lines and "/src/k.cu(7): error" in lines and "undefined symbol" in lines
