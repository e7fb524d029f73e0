"""First use, cache hits, rebuilds and the cache key, as users meet them (separate processes)."""
from pathlib import Path

import pytest
import torch

from op_builder import jit, toolchain
from op_builder.builder import CppOpBuilder
from jit_helpers import LOAD_TINY, python_env, run_python, write_tiny_source

USE_APEX_C = "import torch, apex_C; print('flat', apex_C.flatten([torch.ones(2), torch.zeros(3)]).tolist())"


def _entries(cache_dir: Path, op: str) -> list[Path]:
    return sorted(p for p in (cache_dir / op).glob("*") if p.is_dir() and not p.name.startswith("."))


def test_fresh_cache_compiles_then_second_process_hits_cache(cache_dir, failing_compiler):
    first = run_python(USE_APEX_C, python_env(cache_dir))
    assert first.returncode == 0, first.stderr
    assert "flat [1.0, 1.0, 0.0, 0.0, 0.0]" in first.stdout
    assert "apex: compiling op 'apex_C'" in first.stderr
    assert len(_entries(cache_dir, "apex_C")) == 1

    second = run_python(USE_APEX_C, python_env(cache_dir, CXX=failing_compiler))
    assert second.returncode == 0, second.stderr
    assert "flat [1.0, 1.0, 0.0, 0.0, 0.0]" in second.stdout
    assert second.stderr.strip() == "" or "compiling" not in second.stderr  # cache hits are silent
    assert "a compiler was run" not in second.stderr


def test_source_edit_triggers_rebuild(cache_dir, tiny_root):
    env = python_env(cache_dir)
    first = run_python(LOAD_TINY, env, str(tiny_root))
    assert "answer 42" in first.stdout, first.stderr
    write_tiny_source(tiny_root, value=43)
    second = run_python(LOAD_TINY, env, str(tiny_root))
    assert "answer 43" in second.stdout, second.stderr
    assert "apex: compiling op 'tiny_op'" in second.stderr
    assert len(_entries(cache_dir, "tiny_op")) == 2


def test_cache_key_covers_torch_version_flags_and_sources(tiny_root, monkeypatch):
    class Tiny(CppOpBuilder):
        NAME = "tiny_op"
        CPP_SOURCES = ["tiny/tiny.cpp"]

    builder = Tiny(source_root=tiny_root)
    base = builder.key(builder.fingerprint(with_gpu=False))
    assert builder.key(builder.fingerprint(with_gpu=False)) == base  # stable

    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert builder.key(builder.fingerprint(with_gpu=False)) != base
    monkeypatch.undo()

    monkeypatch.setattr(Tiny, "EXTRA_CXX_FLAGS", ["-DSOMETHING"])
    assert builder.key(builder.fingerprint(with_gpu=False)) != base
    monkeypatch.undo()

    # A build for another CPU (AVX2 flags or not) is another entry: a shared home directory
    # never hands a module built with AVX2 to a machine without it.
    flags = tuple(toolchain.host_cpu_flags())
    monkeypatch.setattr(toolchain, "host_cpu_flags", lambda: () if flags else ("-mavx2",))
    assert builder.key(builder.fingerprint(with_gpu=False)) != base
    monkeypatch.undo()

    write_tiny_source(tiny_root, value=7)
    assert builder.key(builder.fingerprint(with_gpu=False)) != base


def test_changed_torch_version_never_loads_the_old_entry(cache_dir, tiny_root, failing_compiler):
    """Same sources, another torch: the old .so must not be loaded; a build is attempted instead."""
    env = python_env(cache_dir)
    assert "answer 42" in run_python(LOAD_TINY, env, str(tiny_root)).stdout
    pretend_upgrade = "import torch; torch.__version__ = '99.0.0'\n" + LOAD_TINY
    upgraded = run_python(pretend_upgrade, python_env(cache_dir, CXX=failing_compiler), str(tiny_root))
    assert upgraded.returncode != 0
    assert "apex: compiling op 'tiny_op' for torch 99.0.0" in upgraded.stderr


@pytest.mark.parametrize("env_var", ["APEX_JIT_VERBOSE"])
def test_verbose_shows_compiler_output(cache_dir, tiny_root, env_var):
    result = run_python(LOAD_TINY, python_env(cache_dir, **{env_var: "1"}), str(tiny_root))
    assert "answer 42" in result.stdout, result.stderr
    assert "tiny.cpp" in result.stderr  # ninja -v echoes the compile command


def test_cpu_flags_follow_the_cpu_and_prebuilt_modules_stay_portable(tiny_root, monkeypatch):
    """JIT builds compile the C++ kernels for this CPU (ATen's AVX2 Vectorized where torch
    finds AVX2); prebuilt fingerprints carry no CPU flags and still serve on any CPU."""
    class Tiny(CppOpBuilder):
        NAME = "tiny_op"
        CPP_SOURCES = ["tiny/tiny.cpp"]

    builder = Tiny(source_root=tiny_root)
    has_avx2 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    jit_fingerprint = builder.fingerprint(with_gpu=False)
    assert ("-DCPU_CAPABILITY_AVX2" in jit_fingerprint["cpu_flags"]) == has_avx2
    portable = builder.fingerprint(with_gpu=False, portable=True)
    assert portable["cpu_flags"] == []
    # at::parallel_for is an inline `#pragma omp parallel`: without -fopenmp it runs serially.
    assert ("-fopenmp" in builder.cxx_flags()) == torch._C.has_openmp

    monkeypatch.setattr(jit, "prebuilt_manifest", lambda name: {"fingerprint": portable, "file": "tiny_op.so"})
    path, differing = jit.find_prebuilt(builder, dict(jit_fingerprint, cpu_flags=["-mavx2"]))
    assert differing == [] and path is not None and path.name == "tiny_op.so"
