"""`python -m apex.op_builder.compile_check`: private temporary paths, the cause of a failure, --fast."""
import os
import stat
import tempfile
from pathlib import Path

import pytest
import torch

from apex.op_builder import compile_check, toolchain
from apex.op_builder.builder import CppOpBuilder, CUDAOpBuilder
from jit_helpers import write_tiny_source

TINY_KERNEL = """
extern "C" __global__ void tiny_fill(float* out) { out[threadIdx.x] = 1.0f; }
extern "C" int tiny_threads() { return 32; }
"""


@pytest.fixture
def registered(monkeypatch):
    """Make compile_check see ``builder`` as the only registered op."""
    def register(builder):
        monkeypatch.setattr(compile_check, "builder_for", lambda name: builder)
        monkeypatch.setattr(compile_check, "all_builders", lambda: {builder.NAME: type(builder)})
    return register


class Tiny(CppOpBuilder):
    NAME = "tiny_op"
    SOURCE_DIR = "tiny"


def test_failure_log_is_private_and_never_a_fixed_tmp_name(tmp_path, registered, capsys):
    """It used to write /tmp/apex-check-<op>.log: another user's symlink there made it overwrite a file."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    planted = Path(tempfile.gettempdir()) / "apex-check-tiny_op.log"
    planted.unlink(missing_ok=True)
    planted.symlink_to(victim)
    try:
        write_tiny_source(tmp_path / "src", body="int broken( {")
        registered(Tiny(source_root=tmp_path / "src"))
        assert compile_check.main(["tiny_op"]) == 1
    finally:
        planted.unlink()
    assert victim.read_text() == "precious"
    message = capsys.readouterr().err
    log = Path(message.split("full build log: ")[1].split("\n")[0])
    assert log.is_file() and "tiny.cpp" in log.read_text()
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700 and log.parent.name.startswith("apex-check-tiny_op-")


def test_success_reports_and_leaves_nothing(tmp_path, registered, capsys):
    write_tiny_source(tmp_path / "src")
    registered(Tiny(source_root=tmp_path / "src"))
    before = set(Path(tempfile.gettempdir()).glob("apex-check-tiny_op-*"))
    assert compile_check.main(["--all"]) == 0
    assert "tiny_op: compiled (CPU only)" in capsys.readouterr().out
    assert set(Path(tempfile.gettempdir()).glob("apex-check-tiny_op-*")) == before


@pytest.mark.skipif(not torch.version.cuda or toolchain.nvcc() is None, reason="needs a CUDA torch and nvcc")
def test_fast_check_compiles_cuda_sources_to_ptx(tmp_path, registered, capsys, monkeypatch):
    class TinyKernels(CUDAOpBuilder):
        NAME = "tiny_op"
        SOURCE_DIR = "tiny"

    write_tiny_source(tmp_path / "src")
    write_tiny_source(tmp_path / "src", body=TINY_KERNEL, name="tiny_kernel.cu")
    registered(TinyKernels(source_root=tmp_path / "src"))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    assert compile_check.main(["tiny_op", "--fast"]) == 0, capsys.readouterr().err
    assert "tiny_op: compiled (GPU archs 9.0, fast)" in capsys.readouterr().out


def test_cuda_check_with_a_cpu_only_torch_names_the_cause(tmp_path, registered, capsys, monkeypatch):
    class TinyKernels(CUDAOpBuilder):
        NAME = "tiny_op"
        SOURCE_DIR = "tiny"

    write_tiny_source(tmp_path / "src")
    registered(TinyKernels(source_root=tmp_path / "src"))
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    assert compile_check.main(["tiny_op"]) == 1
    message = capsys.readouterr().err
    assert "is a CPU-only build" in message and "CUDA None" not in message


def test_nothing_named_is_a_usage_error():
    with pytest.raises(SystemExit) as caught:
        compile_check.main([])
    assert caught.value.code == 2


def test_runs_as_a_module_under_both_names():
    import subprocess
    import sys

    from jit_helpers import REPO, import_path

    from_checkout = str(REPO) in import_path().split(os.pathsep)
    for module in ("apex.op_builder.compile_check", "op_builder.compile_check"):
        if module.startswith("op_builder") and not from_checkout:
            continue  # the old name exists in the source tree only
        result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                                env=dict(os.environ, PYTHONPATH=import_path()), cwd=REPO / "tests")
        assert result.returncode == 0 and "--fast" in result.stdout, result.stderr
