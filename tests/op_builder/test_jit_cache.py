"""First use, cache hits, rebuilds and the cache key, as users meet them (separate processes)."""
import textwrap
from pathlib import Path

import pytest
import torch

from apex.op_builder import jit, toolchain
from apex.op_builder.builder import CppOpBuilder
from apex.op_builder.plan import Purpose, plan_build
from jit_helpers import LOAD_TINY, LOAD_TINY_PREAMBLE, TINY_TORCH_OP, python_env, run_python, write_tiny_source

# The op pattern in miniature: a dispatcher op, loaded as a plain library, then its after_load hook.
USE_TORCH_OP = LOAD_TINY_PREAMBLE + textwrap.dedent("""
    import torch

    class TinyTorchOp(TinyBuilder):
        def after_load(self):
            print("after_load sees", torch.ops.apex_test_tiny.twice(torch.ones(2)).tolist())

    library = load_builder(TinyTorchOp(source_root=sys.argv[1]))
    print("loaded", library.name, torch.ops.apex_test_tiny.twice(torch.arange(3.0)).tolist())
""")


class Tiny(CppOpBuilder):
    NAME = "tiny_op"
    SOURCE_DIR = "tiny"


def _entries(cache_dir: Path, op: str) -> list[Path]:
    return sorted(p for p in (cache_dir / op).glob("*") if p.is_dir() and not p.name.startswith("."))


def _key(builder, purpose=Purpose.JIT) -> str:
    return plan_build(builder, purpose).key


def test_fresh_cache_compiles_a_torch_op_then_a_second_process_hits_the_cache(cache_dir, tmp_path, failing_compiler):
    root = tmp_path / "src"
    write_tiny_source(root, body=TINY_TORCH_OP)
    first = run_python(USE_TORCH_OP, python_env(cache_dir), str(root))
    assert first.returncode == 0, first.stderr
    assert "after_load sees [2.0, 2.0]" in first.stdout
    assert "loaded tiny_op.so [0.0, 2.0, 4.0]" in first.stdout
    assert "apex: compiling op 'tiny_op'" in first.stderr
    assert len(_entries(cache_dir, "tiny_op")) == 1

    second = run_python(USE_TORCH_OP, python_env(cache_dir, CXX=failing_compiler), str(root))
    assert second.returncode == 0, second.stderr
    assert "loaded tiny_op.so [0.0, 2.0, 4.0]" in second.stdout
    assert second.stderr.strip() == ""  # cache hits are silent
    assert not list((cache_dir / "tiny_op").glob("*.lock")), "lock files pile up in the cache"


def test_load_op_loads_once_per_process_from_many_threads(cache_dir, tiny_root, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("APEX_CACHE_DIR", str(cache_dir))
    monkeypatch.setattr(jit.registry, "builder_for", lambda name: Tiny(source_root=tiny_root))
    monkeypatch.setattr(jit, "_loaded", {})
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: jit.load_op("tiny_op"), range(8)))
    assert len({id(p) for p in paths}) == 1 and paths[0].name == "tiny_op.so"
    assert str(paths[0]) in torch.ops.loaded_libraries


def test_source_edit_triggers_rebuild(cache_dir, tiny_root):
    env = python_env(cache_dir)
    first = run_python(LOAD_TINY, env, str(tiny_root))
    assert "answer 42" in first.stdout, first.stderr
    write_tiny_source(tiny_root, value=43)
    second = run_python(LOAD_TINY, env, str(tiny_root))
    assert "answer 43" in second.stdout, second.stderr
    assert "apex: compiling op 'tiny_op'" in second.stderr
    assert len(_entries(cache_dir, "tiny_op")) == 2


def test_cache_key_covers_torch_version_flags_sources_and_cpu(tiny_root, monkeypatch):
    builder = Tiny(source_root=tiny_root)
    base = _key(builder)
    assert _key(builder) == base  # stable

    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert _key(builder) != base
    monkeypatch.undo()

    monkeypatch.setattr(Tiny, "EXTRA_CXX_FLAGS", ["-DSOMETHING"])
    assert _key(builder) != base
    monkeypatch.undo()

    # A build for another CPU (AVX2 flags or not) is another entry: a shared home directory
    # never hands a library built with AVX2 to a machine without it.
    flags = tuple(toolchain.host_cpu_flags())
    monkeypatch.setattr(toolchain, "host_cpu_flags", lambda: () if flags else ("-mavx2",))
    assert _key(builder) != base
    monkeypatch.undo()

    write_tiny_source(tiny_root, value=7)
    assert _key(builder) != base


def test_changed_torch_version_never_loads_the_old_entry(cache_dir, tiny_root, failing_compiler):
    """Same sources, another torch: the old library must not be loaded; a build is attempted instead."""
    env = python_env(cache_dir)
    assert "answer 42" in run_python(LOAD_TINY, env, str(tiny_root)).stdout
    pretend_upgrade = "import torch; torch.__version__ = '99.0.0'\n" + LOAD_TINY
    upgraded = run_python(pretend_upgrade, python_env(cache_dir, CXX=failing_compiler), str(tiny_root))
    assert upgraded.returncode != 0
    assert "apex: compiling op 'tiny_op' for torch 99.0.0" in upgraded.stderr


def test_verbose_shows_compiler_output(cache_dir, tiny_root):
    result = run_python(LOAD_TINY, python_env(cache_dir, APEX_JIT_VERBOSE="1"), str(tiny_root))
    assert "answer 42" in result.stdout, result.stderr
    assert "tiny.cpp" in result.stderr  # ninja -v echoes the compile command


def test_cpu_flags_follow_the_cpu_and_prebuilt_libraries_stay_portable(tiny_root, monkeypatch):
    """JIT builds compile the C++ kernels for this CPU (ATen's AVX2 Vectorized where torch finds
    AVX2); prebuilt fingerprints carry no CPU flags and still serve on any CPU."""
    builder = Tiny(source_root=tiny_root)
    has_avx2 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    jit_plan = plan_build(builder, Purpose.JIT)
    assert ("-DCPU_CAPABILITY_AVX2" in jit_plan.cxx_flags) == has_avx2
    assert ("-DCPU_CAPABILITY_AVX2" in jit_plan.fingerprint["cpu_flags"]) == has_avx2
    portable = plan_build(builder, Purpose.PREBUILD)
    assert portable.fingerprint["cpu_flags"] == [] and "-mavx2" not in portable.cxx_flags
    # at::parallel_for is an inline `#pragma omp parallel`: without -fopenmp it runs serially.
    assert ("-fopenmp" in jit_plan.cxx_flags) == torch._C.has_openmp

    library = tiny_root / "tiny_op.so"
    library.write_bytes(b"built")
    from apex.op_builder import integrity

    monkeypatch.setattr(jit.paths, "PREBUILT_DIR", tiny_root)
    monkeypatch.setattr(jit, "prebuilt_manifest", lambda name: {"fingerprint": portable.fingerprint, **integrity.record(library)})
    other_cpu = plan_build(builder, Purpose.JIT)
    object.__setattr__(other_cpu, "fingerprint", dict(other_cpu.fingerprint, cpu_flags=["-mavx2"]))
    path, why_not = jit.find_prebuilt(other_cpu)
    assert why_not == "" and path == library


@pytest.mark.parametrize("field, value", [("torch", "0.0.1"), ("cxx11_abi", None)])
def test_a_prebuilt_library_for_another_torch_is_not_used(tiny_root, monkeypatch, field, value):
    builder = Tiny(source_root=tiny_root)
    plan = plan_build(builder, Purpose.JIT)
    monkeypatch.setattr(jit, "prebuilt_manifest", lambda name: {"fingerprint": dict(plan.fingerprint, **{field: value}),
                                                                "file": "tiny_op.so"})
    path, why_not = jit.find_prebuilt(plan)
    assert path is None and f"{field} differ" in why_not
