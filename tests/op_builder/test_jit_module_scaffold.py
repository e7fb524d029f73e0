"""scripts/jit_module.py: a scaffolded op builds and passes its own tests without edits, and the
builder finds it with nothing else listing it (registry, sources by convention, op table)."""
import shutil
import subprocess
import sys

import pytest

from jit_helpers import REPO, python_env

SCRIPT = REPO / "scripts" / "jit_module.py"


def _copy_framework(dest):
    for part in ("op_builder", "compatibility", "scripts", "apex"):
        # symlinks kept: apex/op_builder must stay the link to op_builder/, where the scaffold writes
        shutil.copytree(REPO / part, dest / part, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "_prebuilt"))
    shutil.copytree(REPO / "csrc" / "include", dest / "csrc" / "include")
    shutil.copy(REPO / "pyproject.toml", dest)
    (dest / "tests").mkdir()
    shutil.copy(REPO / "tests" / "conftest.py", dest / "tests")


def _scaffold(root, *args):
    return subprocess.run([sys.executable, str(SCRIPT), *args, "--root", str(root)], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=60)


def test_scaffolded_op_builds_and_its_tests_pass(tmp_path, cache_dir):
    root = tmp_path / "repo"
    _copy_framework(root)
    made = _scaffold(root, "scaffolded_op")
    assert made.returncode == 0, made.stderr
    for path in ("csrc/scaffolded_op/scaffolded_op.cpp", "csrc/scaffolded_op/scaffolded_op_cpu.cpp",
                 "csrc/scaffolded_op/scaffolded_op_cuda.cu", "op_builder/ops/scaffolded_op.py",
                 "compatibility/scaffolded_op.py"):
        assert (root / path).is_file(), path
    (test_file,) = (root / "tests").rglob("test_scaffolded_op.py")
    # Without the precompiled torch headers: one op in a fresh cache would pay for building them
    # (test_precompiled_header.py tests them), and this way the scaffold is known to compile as a
    # compiler other than GCC would compile it.
    env = python_env(cache_dir, APEX_PCH="0")
    env["PYTHONPATH"] = f"{root}:{root / 'compatibility'}"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu",
                             str(test_file.relative_to(root))], cwd=root, env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout

    registry = subprocess.run([sys.executable, "-c", "from apex.op_builder import all_builders\n"
                               "from apex.report import op_table_markdown\n"
                               "print(all_builders()['scaffolded_op'].build_var()); print(op_table_markdown())"],
                              cwd=root, env=env, capture_output=True, text=True)
    assert registry.stdout.splitlines()[0] == "APEX_BUILD_SCAFFOLDED_OP", registry.stderr
    assert "| `scaffolded_op` |" in registry.stdout


def test_scaffolding_an_existing_name_is_refused(tmp_path):
    root = tmp_path / "repo"
    _copy_framework(root)
    refused = _scaffold(root, "syncbn")
    assert refused.returncode != 0
    assert "already exists" in refused.stderr or "already importable" in refused.stderr


@pytest.mark.parametrize("args, message", [([], "missing op name"), (["9bad"], "not a valid module name")])
def test_scaffold_without_a_usable_name_explains(tmp_path, args, message):
    root = tmp_path / "repo"
    _copy_framework(root)
    result = _scaffold(root, *args)
    assert result.returncode != 0 and message in result.stderr
