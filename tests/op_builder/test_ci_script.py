""".ci/run: missing tools are named before anything starts; pip failures are never swallowed."""
import re
import shutil
import subprocess

import pytest

from jit_helpers import REPO

CI = REPO / ".ci" / "run"


def _path_with(tmp_path, tools):
    """A PATH holding only ``tools`` (plus what the script itself needs to start)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ["bash", "dirname", *tools]:
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"needs {tool}")
        (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def _check_tools(path, tmp_path):
    return subprocess.run([shutil.which("bash"), str(CI), "--check-tools"], capture_output=True, text=True,
                          timeout=60, env={"PATH": path, "CUDA_HOME": str(tmp_path / "no-cuda"), "HOME": str(tmp_path)})


def test_missing_compiler_and_nvcc_are_named(tmp_path):
    result = _check_tools(_path_with(tmp_path, ["python3", "make"]), tmp_path)
    assert result.returncode != 0
    assert "CI: g++ is missing" in result.stdout
    assert "CI: nvcc is missing" in result.stdout


def test_all_tools_present_passes_the_check(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    result = _check_tools(_path_with(tmp_path, ["python3", "make", "g++", "nvcc"]), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "missing" not in result.stdout


def test_pip_failures_are_never_swallowed():
    """It used to run `pip install ... | grep -v ... || true`: a failed install passed CI."""
    script = CI.read_text()
    assert "set -euo pipefail" in script
    for line in script.splitlines():
        if re.search(r"\bpip\b.*\b(install|wheel)\b", line):
            assert "|| true" not in line and "| grep" not in line, line
