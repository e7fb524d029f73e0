"""A failed build raises OpBuildError naming the op, the file:line, the command, the log, and a hint;
the CUDA toolkit is found where torch finds it, and a bad CUDA_HOME is named."""
import pytest
import torch

from apex.op_builder import toolchain
from apex.op_builder.builder import CppOpBuilder
from apex.op_builder.errors import OpBuildError, first_error_lines
from apex.op_builder.jit import load_builder
from jit_helpers import write_tiny_source

BROKEN = """
int this_is_fine = 1;
extern "C" int broken() { return undeclared_identifier; }
"""


class Tiny(CppOpBuilder):
    NAME = "tiny_op"
    SOURCE_DIR = "tiny"


@pytest.fixture
def cuda13_torch(monkeypatch):
    """The CUDA torch this runs under, as a CUDA 13.0 build (what the messages below assume)."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.version, "hip", None)


def _fake_toolkit(root, release="13.0"):
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    nvcc.chmod(0o755)
    return root


def test_broken_source_reports_file_line_command_and_log(cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("APEX_CACHE_DIR", str(cache_dir))
    source = write_tiny_source(tmp_path / "src", body=BROKEN)
    with pytest.raises(OpBuildError) as caught:
        load_builder(Tiny(source_root=tmp_path / "src"))
    message = str(caught.value)
    assert "apex could not build op 'tiny_op': compilation failed" in message
    assert f"{source}:3:" in message and "undeclared_identifier" in message
    assert "failing command:" in message and "tiny.cpp" in message
    assert caught.value.log_path.is_file()
    assert "ninja -v returned non-zero exit status" not in message.splitlines()[0]


def test_a_failure_outside_the_compiler_names_its_cause(cache_dir, tmp_path, monkeypatch):
    """Not only "the build failed": the cause, which used to be only in the log, is in the message."""
    class MissingSource(Tiny):
        CPP_SOURCES = ["tiny/not_there.cpp"]

    monkeypatch.setenv("APEX_CACHE_DIR", str(cache_dir))
    write_tiny_source(tmp_path / "src")
    with pytest.raises(OpBuildError) as caught:
        load_builder(MissingSource(source_root=tmp_path / "src"))
    assert "not_there.cpp" in str(caught.value)
    assert caught.value.summary != "the build failed"


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


def test_bad_cuda_home_is_named_with_its_value(tmp_path, cuda13_torch):
    env = {"PATH": str(tmp_path), "CUDA_HOME": "/nonexistent", "CXX": "/bin/sh"}
    (tmp_path / "ninja").write_text("#!/bin/sh\n")
    (tmp_path / "ninja").chmod(0o755)
    with pytest.raises(OpBuildError, match="CUDA_HOME=/nonexistent has no bin/nvcc") as caught:
        toolchain.check("some_cuda_op", with_cuda=True, env=env)
    assert "point CUDA_HOME at a CUDA 13.x toolkit" in str(caught.value)


def test_no_toolkit_anywhere_says_where_it_looked(tmp_path, monkeypatch, cuda13_torch):
    monkeypatch.setattr(toolchain, "DEFAULT_CUDA_HOME", tmp_path / "no-cuda")
    monkeypatch.setattr(toolchain, "ninja", lambda env=None: "/usr/bin/ninja")
    with pytest.raises(OpBuildError, match="CUDA toolkit \\(nvcc\\) was not found") as caught:
        toolchain.check("some_cuda_op", with_cuda=True, env={"PATH": str(tmp_path), "CXX": "/bin/sh"})
    assert "no nvcc is on PATH" in str(caught.value) and "install a CUDA 13.x toolkit" in str(caught.value)


def test_toolkit_in_usr_local_cuda_is_found_without_nvcc_on_path(tmp_path, monkeypatch, cuda13_torch):
    """Like torch's own lookup: no CUDA_HOME, no nvcc on PATH, but /usr/local/cuda exists."""
    home = _fake_toolkit(tmp_path / "usr-local-cuda")
    monkeypatch.setattr(toolchain, "DEFAULT_CUDA_HOME", home)
    monkeypatch.setattr(toolchain, "ninja", lambda env=None: "/usr/bin/ninja")
    env = {"PATH": str(tmp_path / "empty"), "CXX": "/bin/sh"}
    toolchain.check("some_cuda_op", with_cuda=True, env=env)  # accepted
    assert toolchain.cuda_home(env) == home and toolchain.nvcc(env) == str(home / "bin" / "nvcc")


def test_cpu_only_torch_says_so_instead_of_cuda_none(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(toolchain, "ninja", lambda env=None: "/usr/bin/ninja")
    with pytest.raises(OpBuildError, match="is a CPU-only build") as caught:
        toolchain.check("some_cuda_op", with_cuda=True, env={"PATH": "/usr/bin:/bin", "CXX": "/bin/sh"})
    assert "None" not in str(caught.value)


def test_nvcc_torch_cuda_mismatch_gives_the_hint(tmp_path, monkeypatch, cuda13_torch):
    home = _fake_toolkit(tmp_path / "cuda", release="11.8")
    env = {"PATH": "/usr/bin:/bin", "CUDA_HOME": str(home), "CXX": "/bin/sh"}
    monkeypatch.setattr(toolchain, "ninja", lambda env=None: "/usr/bin/ninja")
    with pytest.raises(OpBuildError, match="nvcc is CUDA 11.8 .* but torch was built with CUDA 13.0") as caught:
        toolchain.check("some_cuda_op", with_cuda=True, env=env)
    assert "install a CUDA 13.x toolkit" in str(caught.value)


def test_error_parser_reads_gcc_nvcc_linker_and_ninja_lines():
    log = "\n".join([
        "[1/2] c++ -c a.cpp",
        "FAILED: a.o",
        "c++ -c a.cpp -o a.o",
        "/src/a.cpp:12:5: error: 'x' was not declared in this scope",
        "   12 |     x = 1;",
        "/src/k.cu(7): error: identifier \"y\" is undefined",
        "a.so: undefined symbol: _Z3foov",
        "ninja: error: '/src/gone.cpp', needed by 'gone.o', missing and no known rule to make it",
        "ninja: build stopped: subcommand failed.",
    ])
    lines = first_error_lines(log)
    for expected in ("/src/a.cpp:12:5: error", "/src/k.cu(7): error", "undefined symbol", "gone.cpp"):
        assert expected in lines
