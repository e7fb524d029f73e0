"""Install paths: a plain `pip install .` compiles nothing and imports no torch; the wheel holds only
`apex` and the historical modules at top level; APEX_BUILD_<OP>=1 prebuilds into the wheel; an op
that cannot be prebuilt is skipped with its reason, said once without `pip -v`."""
import os
import pty
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import torch

from apex.op_builder import prebuild
from apex.op_builder.builder import CUDAOpBuilder
from apex.op_builder.plan import Purpose, plan_build
from jit_helpers import REPO, TINY_BUILDER, python_env, run_python, write_tiny_source

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
# What a checkout holds that an install reads.
_PROJECT = ("apex", "op_builder", "compatibility", "csrc", "setup.py", "pyproject.toml", "README.md")


def _build_wheel(source: Path, out_dir: Path, env: dict) -> Path:
    result = subprocess.run([*PIP, "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", str(out_dir), str(source)],
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = out_dir.glob("apex-*.whl")
    return wheel


def _plain_env(cache_dir: Path, **extra: str) -> dict:
    env = python_env(cache_dir, **extra)
    for var in [v for v in env if v.startswith("APEX_BUILD_")]:
        del env[var]
    return env


def _copy_project(dest: Path) -> Path:
    for name in _PROJECT:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, dest / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "_prebuilt", "*.egg-info"))
        else:
            shutil.copy2(source, dest / name)
    return dest


def test_plain_wheel_compiles_nothing_imports_no_torch_and_leaves_no_build_dir(tmp_path, cache_dir, failing_compiler):
    env = _plain_env(cache_dir, CXX=failing_compiler)
    env["PYTHONPATH"] = os.pathsep.join([_poisoned_torch(tmp_path), env["PYTHONPATH"]])
    source = _copy_project(tmp_path / "checkout")
    started = time.monotonic()
    wheel = _build_wheel(source, tmp_path / "dist", env)
    assert time.monotonic() - started < 120
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith(".so")]
    assert [n for n in names if n.startswith("apex/op_builder/csrc/include/apex/")]
    assert "apex_C.py" in names and "apex/report.py" in names and "apex/op_builder/jit.py" in names
    # Only apex and the historical module names at top level: no `op_builder` package.
    top_level = {n.split("/")[0] for n in names if not n.startswith("apex-")}
    assert top_level == {"apex"} | {p.name for p in (REPO / "compatibility").glob("*.py")}
    # ninja is a dependency (torch's builder needs it; a venv's copy is found unactivated), torch is not.
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    requires = [line for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert requires == ["Requires-Dist: ninja"], requires
    # setuptools' scratch space is not left in the checkout (a stale build/lib reached later wheels).
    assert not (source / "build").exists() and not list(source.glob("*.egg-info"))


def _poisoned_torch(tmp_path: Path) -> str:
    """A PYTHONPATH entry whose torch fails to import: whoever imports it fails loudly."""
    poisoned = tmp_path / "poisoned"
    (poisoned / "torch").mkdir(parents=True)
    (poisoned / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    return str(poisoned)


def test_metadata_with_a_prebuild_requested_imports_no_torch(tmp_path, cache_dir):
    """`APEX_BUILD_CUDA_OPS=1 pip install` with a CPU-only torch used to fail at metadata generation
    (OSError: CUDA_HOME environment variable is not set): metadata never needs torch."""
    env = python_env(cache_dir, APEX_BUILD_CUDA_OPS="1")
    env["PYTHONPATH"] = os.pathsep.join([_poisoned_torch(tmp_path), env["PYTHONPATH"]])
    result = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path)], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "apex.egg-info" / "PKG-INFO").is_file()


def test_an_sdist_builds_the_same_layout(tmp_path, cache_dir):
    """The sdist has no apex/op_builder link: setup.py loads the builder by path, the wheel is whole."""
    env = _plain_env(cache_dir)
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "sdist")], cwd=REPO, env=env,
                   check=True, capture_output=True, timeout=300)
    (sdist,) = (tmp_path / "sdist").glob("apex-*.tar.gz")
    names = zipfile.ZipFile(_build_wheel(sdist, tmp_path / "dist", env)).namelist()
    assert "apex/op_builder/jit.py" in names and "apex/op_builder/ops/__init__.py" in names
    assert [n for n in names if n.startswith("apex/op_builder/csrc/include/")]


def test_a_renamed_op_file_does_not_come_back_in_the_next_wheel(tmp_path, cache_dir):
    """A stale build/ used to ship the old file too: "two builders declare op ..." after install."""
    source = _copy_project(tmp_path / "checkout")
    env = _plain_env(cache_dir)
    _build_wheel(source, tmp_path / "first", env)
    (source / "op_builder" / "ops" / "apex_c.py").rename(source / "op_builder" / "ops" / "renamed_apex_c.py")
    wheel = _build_wheel(source, tmp_path / "second", env)
    names = zipfile.ZipFile(wheel).namelist()
    assert "apex/op_builder/ops/renamed_apex_c.py" in names and "apex/op_builder/ops/apex_c.py" not in names

    site = tmp_path / "site"
    subprocess.run([*PIP, "install", "-q", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=300)
    listed = run_python("from apex.op_builder import all_builders; print(sorted(all_builders()))",
                        python_env(cache_dir, PYTHONPATH=str(site)), cwd=tmp_path)
    assert listed.returncode == 0 and "'apex_C'" in listed.stdout, listed.stderr


def test_apex_build_op_prebuilds_into_the_wheel_and_loads_without_compiling(tmp_path, cache_dir, failing_compiler):
    """APEX_BUILD_<OP>=1 end to end, with the tiny op declared in a copy of the project (a real op's
    prebuild would compile it a second time in the suite; CI prebuilds a real CUDA op)."""
    source = _copy_project(tmp_path / "checkout")
    write_tiny_source(source / "csrc")
    (source / "op_builder" / "ops" / "tiny_op.py").write_text(TINY_BUILDER)
    wheel = _build_wheel(source, tmp_path / "dist", {**_plain_env(cache_dir), "APEX_BUILD_TINY_OP": "1"})
    names = zipfile.ZipFile(wheel).namelist()
    assert "apex/op_builder/_prebuilt/tiny_op.so" in names and "apex/op_builder/_prebuilt/tiny_op.json" in names
    assert not [n for n in names if n.endswith(".so") and "tiny_op" not in n]  # only the op asked for
    site = tmp_path / "site"
    subprocess.run([*PIP, "install", "-q", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=300)

    env = python_env(tmp_path / "empty-cache", CXX=failing_compiler, PYTHONPATH=str(site))
    code = ("import ctypes, apex.op_builder as b\n"
            "from apex.op_builder.jit import build_status\n"
            "assert b.__file__.startswith(%r), b.__file__\n"
            "status = build_status(b.builder_for('tiny_op'))\n"
            "print(status, ctypes.CDLL(str(b.load_op('tiny_op'))).tiny_answer())" % str(site))
    result = run_python(code, env, cwd=tmp_path)  # not the checkout: '' on sys.path would shadow the wheel
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["prebuilt", "42"]
    assert "compiling" not in result.stderr and "a compiler was run" not in result.stderr


def _run_in_terminal(command: list[str], env: dict, timeout: float = 300) -> str:
    """Run ``command`` with a pseudo-terminal as its controlling terminal (a user's shell); its output."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once
        os.execvpe(command[0], command, env)
    output, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    os.waitpid(pid, 0)
    os.close(fd)
    return output.decode(errors="replace")


def test_cuda_ops_that_cannot_be_prebuilt_are_skipped_once_with_their_reason(tmp_path, cache_dir):
    """APEX_BUILD_CUDA_OPS=1 without a usable toolkit: the install succeeds (metadata generation
    included), each skip reason shows once on the terminal without -v, and the wheel records it."""
    env = python_env(cache_dir, APEX_BUILD_CUDA_OPS="1", CUDA_HOME="/nonexistent")
    output = _run_in_terminal([*PIP, "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", str(tmp_path),
                               str(REPO)], env)
    wheels = list(tmp_path.glob("apex-*.whl"))
    assert len(wheels) == 1, output
    cuda_ops = [cls.NAME for cls in prebuild.requested({"APEX_BUILD_CUDA_OPS": "1"})]
    for name in cuda_ops:
        assert output.count(f"apex: not prebuilding '{name}': ") == 1, output
    assert "CUDA_HOME=/nonexistent has no bin/nvcc" in output or "is a CPU-only build" in output
    skipped = zipfile.ZipFile(wheels[0]).read("apex/op_builder/_prebuilt/skipped.json").decode()
    assert all(f'"{name}"' in skipped for name in cuda_ops)


def test_cuda_prebuild_with_a_cpu_only_torch_is_a_skip_not_a_crash(tmp_path, monkeypatch):
    class Kernels(CUDAOpBuilder):
        NAME = "kernels_op"

    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    builder = Kernels(source_root=tmp_path)
    assert "is a CPU-only build" in prebuild.cannot_build(builder, plan_build(builder, Purpose.PREBUILD))
