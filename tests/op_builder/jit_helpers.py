"""Helpers for testing the builder as users meet it: separate processes, private caches.

Most tests use "tiny_op", a plain C++ library (no torch headers) that compiles in about a second,
so the framework's behaviour (cache, lock, rebuild, errors, killed builds) is tested without
waiting for torch headers. It is loaded the way every op library is (torch.ops.load_library) and
its functions are called through ctypes. TINY_TORCH_OP is the real pattern in miniature: a
dispatcher op registered from C++.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

TINY_SOURCE = """
extern "C" int tiny_answer() {{ return {value}; }}
extern "C" int tiny_with_cuda() {{
#ifdef APEX_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}}
"""

# A dispatcher op in its own test namespace, the way apex's op libraries register theirs.
TINY_TORCH_OP = """
#include <ATen/core/Tensor.h>
#include <torch/library.h>
at::Tensor twice(const at::Tensor& x) { return x.mul(2); }
TORCH_LIBRARY_FRAGMENT(apex_test_tiny, m) { m.def("twice(Tensor x) -> Tensor", &twice); }
"""

# Declares TinyBuilder, the builder of the tiny op (sources: <source root>/tiny): a script's
# preamble, or the whole of an op_builder/ops/ module.
TINY_BUILDER = textwrap.dedent("""
    from apex.op_builder.builder import CppOpBuilder

    class TinyBuilder(CppOpBuilder):
        \"\"\"A one-function test op.\"\"\"

        NAME = "tiny_op"
        SOURCE_DIR = "tiny"
""")

# A script that loads the tiny op from the source root given as argv[1] and prints its answer.
LOAD_TINY_PREAMBLE = "import ctypes, sys\nfrom apex.op_builder.jit import load_builder\n" + TINY_BUILDER
LOAD_TINY = LOAD_TINY_PREAMBLE + textwrap.dedent("""
    library = load_builder(TinyBuilder(source_root=sys.argv[1]))
    print("answer", ctypes.CDLL(str(library)).tiny_answer())
""")


def write_tiny_source(root: Path, value: int = 42, body: str | None = None, name: str = "tiny.cpp") -> Path:
    source = root / "tiny" / name
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(body if body is not None else TINY_SOURCE.format(value=value))
    return source


def import_path() -> str:
    """PYTHONPATH that finds the apex being tested (the checkout, or an installed wheel) first."""
    import apex

    site = Path(apex.__path__[0]).resolve().parent
    return os.pathsep.join([str(REPO), str(REPO / "compatibility")] if site == REPO else [str(site)])


def python_env(cache_dir: Path, **extra: str) -> dict:
    env = dict(os.environ)
    env.update(APEX_CACHE_DIR=str(cache_dir), PYTHONPATH=import_path())
    env.pop("APEX_JIT_VERBOSE", None)
    env.update(extra)
    return env


def run_python(code: str, env: dict, *args: str, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def start_python(code: str, env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
