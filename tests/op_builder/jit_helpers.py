"""Helpers for testing the builder as users meet it: separate processes, private caches.

Most tests use "tiny_op", a Python C-API module that compiles in a second or two,
so the framework's behaviour (cache, lock, rebuild, errors) is tested without
waiting for torch headers; the real apex_C is used where the real path matters.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

TINY_SOURCE = """
#include <Python.h>
static PyObject* answer(PyObject*, PyObject*) {{ return PyLong_FromLong({value}); }}
static PyMethodDef methods[] = {{{{"answer", answer, METH_NOARGS, ""}}, {{nullptr, nullptr, 0, nullptr}}}};
static struct PyModuleDef definition = {{PyModuleDef_HEAD_INIT, "tiny_op", nullptr, -1, methods}};
PyMODINIT_FUNC PyInit_tiny_op() {{ return PyModule_Create(&definition); }}
"""

# Loads tiny_op from the source root given as argv[1] and prints answer().
LOAD_TINY = textwrap.dedent("""
    import sys
    from op_builder.builder import CppOpBuilder
    from op_builder.jit import load_builder

    class TinyBuilder(CppOpBuilder):
        NAME = "tiny_op"
        CPP_SOURCES = ["tiny/tiny.cpp"]

    print("answer", load_builder(TinyBuilder(source_root=sys.argv[1])).answer())
""")


def write_tiny_source(root: Path, value: int = 42, body: str | None = None) -> Path:
    source = root / "tiny" / "tiny.cpp"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(body if body is not None else TINY_SOURCE.format(value=value))
    return source


def python_env(cache_dir: Path, **extra: str) -> dict:
    env = dict(os.environ)
    env.update(APEX_CACHE_DIR=str(cache_dir), PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'compatibility'}")
    env.pop("APEX_JIT_VERBOSE", None)
    env.update(extra)
    return env


def run_python(code: str, env: dict, *args: str, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def start_python(code: str, env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


