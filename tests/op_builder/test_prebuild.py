"""Install paths: a plain `pip install .` compiles nothing; APEX_BUILD_APEX_C=1 prebuilds into the wheel."""
import subprocess
import sys
import time
import zipfile

from jit_helpers import REPO, python_env, run_python

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]


def _build_wheel(out_dir, env) -> "Path":
    subprocess.run([*PIP, "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", str(out_dir), str(REPO)],
                   env=env, check=True, capture_output=True, text=True, timeout=900)
    (wheel,) = out_dir.glob("apex-*.whl")
    return wheel


def test_plain_wheel_compiles_nothing_and_ships_sources(tmp_path, cache_dir, failing_compiler):
    env = python_env(cache_dir, CXX=failing_compiler)
    for var in [v for v in env if v.startswith("APEX_BUILD_")]:
        del env[var]
    started = time.monotonic()
    wheel = _build_wheel(tmp_path, env)
    assert time.monotonic() - started < 60
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith(".so")]
    assert "op_builder/csrc/apex_C/flatten_unflatten.cpp" in names
    assert "apex_C.py" in names and "apex/report.py" in names


def test_apex_build_apex_c_prebuilds_and_loads_without_compiling(tmp_path, cache_dir, failing_compiler):
    wheel = _build_wheel(tmp_path, python_env(cache_dir, APEX_BUILD_APEX_C="1"))
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if n.startswith("op_builder/_prebuilt/apex_C") and n.endswith(".so")]
    site = tmp_path / "site"
    subprocess.run([*PIP, "install", "-q", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=300)

    env = python_env(tmp_path / "empty-cache", CXX=failing_compiler, PYTHONPATH=str(site))
    code = ("import torch, apex_C, op_builder; assert op_builder.__file__.startswith(%r), op_builder.__file__\n"
            "print(apex_C.flatten([torch.ones(2), torch.ones(1)]).tolist())" % str(site))
    result = run_python(code, env, cwd=tmp_path)  # not the checkout: '' on sys.path would shadow the wheel
    assert result.returncode == 0, result.stderr
    assert "[1.0, 1.0, 1.0]" in result.stdout
    assert "compiling" not in result.stderr and "a compiler was run" not in result.stderr
