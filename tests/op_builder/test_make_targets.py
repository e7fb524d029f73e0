"""The Makefile as a newcomer meets it: which Python it uses, what it installs where, `make bench`
on a CPU, and op builds announced live during `make test`."""
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jit_helpers import REPO, import_path

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _make(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(env or os.environ)
    for inherited in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHON"):  # a calling make's PYTHON=... (CI) must not leak in
        env.pop(inherited, None)
    return subprocess.run(["make", "--no-print-directory", "-C", str(REPO), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _without_gpus() -> dict:
    return dict(os.environ, CUDA_VISIBLE_DEVICES="")


def test_bench_on_a_cpu_runs_what_runs_and_names_what_needs_a_gpu(tmp_path):
    """`make bench` on a CPU used to exit 2 with raw "Torch not compiled with CUDA enabled" tracebacks."""
    uses_common = f"import sys; sys.path.insert(0, {str(REPO)!r})\nfrom benchmarks.common import require_gpu\n"
    (tmp_path / "bench_on_cpu.py").write_text("print('cpu benchmark ran')\n")
    (tmp_path / "bench_on_gpu.py").write_text(uses_common + "require_gpu(__file__)\nprint('timed on a GPU')\n")
    (tmp_path / "bench_two_gpus.py").write_text(uses_common + "require_gpu(__file__, 2)\n")
    (tmp_path / "bench_broken.py").write_text("raise SystemExit('a real failure')\n")
    result = _make("bench", f"BENCHMARKS={tmp_path}", f"PYTHON={sys.executable}", env=_without_gpus())
    assert "cpu benchmark ran" in result.stdout and "Traceback" not in result.stdout + result.stderr
    assert "bench_on_gpu.py: needs 1 CUDA GPU (0 visible): skipped" in result.stdout
    skipped = [line for line in result.stdout.splitlines() if line.startswith("needs a GPU (skipped here):")]
    assert len(skipped) == 1 and "bench_on_gpu.py" in skipped[0] and "bench_two_gpus.py" in skipped[0]
    failed = [line for line in result.stdout.splitlines() if line.startswith("failed:")]
    assert failed == [f"failed: {tmp_path}/bench_broken.py"] and result.returncode != 0  # only real failures fail

def test_make_says_which_python_it_uses_and_defaults_to_a_venv():
    named = _make("-n", "demo", "PYTHON=/opt/some/venv/bin/python")
    assert "/opt/some/venv/bin/python examples/gpt_demo.py" in named.stdout
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    default = _make("-n", "-B", "test", env=env)  # -B: the venv recipe shows even where .venv exists
    assert ".venv/bin/python -m pytest" in default.stdout and "python3 -m venv" in default.stdout
    active = _make("-n", "test", env=dict(env, VIRTUAL_ENV="/opt/active"))
    assert "/opt/active/bin/python -m pytest" in active.stdout
    printed = _make("deps", f"PYTHON={sys.executable}")
    assert f"make: using {sys.executable}" in printed.stdout
    assert "Requirement already satisfied" not in printed.stdout  # pip runs only for what is missing


def test_make_deps_never_pip_installs_into_a_system_python():
    """Without an active venv, `make deps` used to pip-install torch into the system Python."""
    system_python = Path(sys.base_prefix) / "bin" / "python3"
    if not system_python.exists() or sys.prefix == sys.base_prefix:
        pytest.skip("needs a venv Python whose base Python is at hand")
    probe = subprocess.run([str(system_python), "-c", "import torch"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("the system Python has torch: make would install nothing")
    result = _make("deps", f"PYTHON={system_python}")
    assert result.returncode != 0
    assert "is not in a virtual environment, so make will not pip-install into it" in result.stderr
    assert "Collecting" not in result.stdout and "Successfully installed" not in result.stdout


def test_op_build_notices_show_live_during_the_test_run(tmp_path):
    """pytest captured the "compiling op X" notice, so `make test` was silent for minutes."""
    (tmp_path / "tests").mkdir()
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "tests")
    (tmp_path / "tests" / "test_builds.py").write_text(textwrap.dedent("""
        from apex.op_builder import notice

        def test_a_build():
            print("ordinary output stays captured")
            notice.say("apex: compiling op 'pretend' for torch, CPU only - first use")
    """))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=import_path()))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "apex: compiling op 'pretend'" in result.stdout + result.stderr
    assert "ordinary output stays captured" not in result.stdout + result.stderr
