"""The precompiled torch headers that op builds share (precompiled_header.py, precompiled_cache.py):
built once and used by every op's registration unit; a corrupt, missing or refused one never fails a
build; APEX_PCH=0 turns it off; its key follows what GCC checks.

Most tests precompile a small stand-in: a source root whose own include/apex/autograd.h and op.h
include a few standard headers, so a header builds in about a second. One test (slow) precompiles torch's real
headers, which is what tells whether GCC accepts them with the flags torch gives an op's units.
"""
import os
import tempfile
from pathlib import Path

import pytest

from apex.op_builder import cache, compile_check, notice, precompiled_cache, precompiled_header, python_entry, unity
from apex.op_builder.builder import CppOpBuilder
from apex.op_builder.compiler import compile_library
from apex.op_builder.jit import load_builder
from apex.op_builder.plan import Purpose, WITH_CUDA_DEFINE, plan_build
from apex.op_builder.precompiled_header import GCH_FILE, HEADER_FILE
from jit_helpers import REPO

if precompiled_header.gcc_identity(os.environ.get("CXX", "c++")) is None:
    pytest.skip("precompiled headers are GCC's; this compiler is not GCC", allow_module_level=True)

STAND_IN_AUTOGRAD_H = '#pragma once\n#include <string>\n#include "apex/op.h"\n'
STAND_IN_OP_H = '#pragma once\n#include <vector>\n#include "apex/more.h"\n'
STAND_IN_MORE_H = "#pragma once\n#include <map>\n#ifdef SOMETHING\n#include <not_precompiled.h>\n#endif\n"
# The registration unit of a stand-in op: it includes apex/op.h, so it uses the precompiled header.
REGISTRATION = ('#include "apex/op.h"\n'
                'extern "C" int tiny_answer() {{ return {value} + std::vector<int>(2).size() - 2; }}\n')
KERNEL = "// no torch headers: compiled as it is\nint tiny_kernel(int x) { return 2 * x; }\n"
DEFINES_FIRST = '#define SOMETHING 1\n#include "apex/op.h"\nint defines_first() { return SOMETHING; }\n'


def _op(name: str, extra_flags=()):
    """A builder for stand-in op ``name`` (sources in <root>/<name>); -H makes GCC list in the build
    log the headers it reads: '! <path>.gch' when it uses a precompiled one."""
    declared = {"NAME": name, "SOURCE_DIR": name, "EXTRA_CXX_FLAGS": ["-H", *extra_flags]}
    return type(f"Op_{name}", (CppOpBuilder,), declared)


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "include" / "apex").mkdir(parents=True)
    (root / "include" / "apex" / "autograd.h").write_text(STAND_IN_AUTOGRAD_H)
    (root / "include" / "apex" / "op.h").write_text(STAND_IN_OP_H)
    (root / "include" / "apex" / "more.h").write_text(STAND_IN_MORE_H)
    for value, name in enumerate(("pch_op_a", "pch_op_b"), start=1):
        (root / name).mkdir()
        (root / name / f"{name}.cpp").write_text(REGISTRATION.format(value=value))
        (root / name / f"{name}_cpu.cpp").write_text(KERNEL)
    return root


@pytest.fixture
def said(monkeypatch) -> list[str]:
    lines: list[str] = []
    monkeypatch.setattr(notice, "_writer", lines.append)
    return lines


@pytest.fixture
def jit_cache(cache_dir: Path, monkeypatch) -> Path:
    monkeypatch.setenv("APEX_CACHE_DIR", str(cache_dir))
    monkeypatch.delenv("APEX_PCH", raising=False)
    return cache_dir


def _headers(cache_dir: Path) -> list[Path]:
    folder = cache_dir / precompiled_cache.CACHE_NAME
    return sorted(p for p in folder.iterdir() if cache.is_entry(p)) if folder.is_dir() else []


def _build_log(cache_dir: Path, op: str) -> str:
    (entry,) = [p for p in (cache_dir / op).iterdir() if cache.is_entry(p)]
    return (entry / "build.log").read_text()


def _used(log: str) -> bool:
    return any(line.startswith("! ") and line.endswith(GCH_FILE) for line in log.splitlines())


def test_the_header_is_built_once_used_by_every_ops_registration_unit_and_rebuilt_if_corrupt(stand_in, jit_cache, said):
    for name in ("pch_op_a", "pch_op_b"):
        load_builder(_op(name)(source_root=stand_in))
    (header,) = _headers(jit_cache)
    assert sum("precompiling torch's headers" in line for line in said) == 1
    assert (header / HEADER_FILE).read_text().splitlines()[1:] == \
        ["#include <string>", "#include <vector>", "#include <map>"]
    for name in ("pch_op_a", "pch_op_b"):
        log = _build_log(jit_cache, name)
        assert _used(log) and precompiled_header.rejection(log) is None, log
        # The kernel unit, which includes no torch header, is compiled as it is, from its own path.
        assert f"-c {stand_in / name / f'{name}_cpu.cpp'}" in log
        (entry,) = [p for p in (jit_cache / name).iterdir() if cache.is_entry(p)]
        assert not (entry / GCH_FILE).is_symlink()  # a library's entry never points at the shared .gch
    # `make clean` knows it as apex's, built from these sources.
    (meta,) = [meta for path, meta in cache.apex_files(jit_cache) if path == header]
    assert meta["op"] == precompiled_cache.CACHE_NAME and meta["source_root"] == str(stand_in.resolve())

    gch = header / GCH_FILE
    data = bytearray(gch.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes: only the checksum tells
    gch.write_bytes(bytes(data))
    (stand_in / "pch_op_c").mkdir()
    (stand_in / "pch_op_c" / "pch_op_c.cpp").write_text(REGISTRATION.format(value=3))
    load_builder(_op("pch_op_c")(source_root=stand_in))
    assert any("are corrupt" in line and "rebuilding" in line for line in said)
    assert _used(_build_log(jit_cache, "pch_op_c"))
    assert cache.entry_problem(header, precompiled_cache.CACHE_NAME, GCH_FILE) is None


def test_a_header_that_fails_to_build_fails_no_op_and_is_not_tried_again(stand_in, jit_cache, said):
    autograd_h = stand_in / "include" / "apex" / "autograd.h"
    autograd_h.write_text(STAND_IN_AUTOGRAD_H + "#include <no_such_header.h>\n")  # the ops include only op.h
    for name in ("pch_op_a", "pch_op_b"):
        load_builder(_op(name)(source_root=stand_in))
        assert not _used(_build_log(jit_cache, name))
    assert sum("could not precompile torch's headers" in line for line in said) == 1, said
    assert not _headers(jit_cache)
    (failed,) = (jit_cache / precompiled_cache.CACHE_NAME).glob("*.failed.log")
    assert "no_such_header.h" in failed.read_text()


def test_apex_pch_0_turns_it_off(stand_in, jit_cache, said, monkeypatch):
    monkeypatch.setenv("APEX_PCH", "0")
    load_builder(_op("pch_op_a")(source_root=stand_in))
    assert not (jit_cache / precompiled_cache.CACHE_NAME).exists()
    log = _build_log(jit_cache, "pch_op_a")
    assert not _used(log) and "-Winvalid-pch" not in log
    assert not any("precompil" in line for line in said)


def test_the_setting_is_on_off_or_auto_and_anything_else_is_refused(monkeypatch):
    for value, meaning in (("", "auto"), ("auto", "auto"), ("0", "off"), ("off", "off"), ("1", "on"), ("yes", "on")):
        assert precompiled_header.setting({"APEX_PCH": value}) == meaning
    assert precompiled_header.setting({}) == "auto"
    with pytest.raises(ValueError, match="APEX_PCH='sometimes'"):
        precompiled_header.setting({"APEX_PCH": "sometimes"})


class _Handing:
    """A provider of precompiled headers that hands out a given file (or none at all)."""

    def __init__(self, gch: Path):
        self.gch = gch

    def gch_for(self, header):
        return self.gch


def _build_with(stand_in: Path, tmp_path: Path, gch: Path, name: str = "pch_op_a") -> str:
    """Build stand-in op ``name`` with ``gch`` as its precompiled header; its build log."""
    plan = plan_build(_op(name)(source_root=stand_in), Purpose.JIT)
    build_dir = tmp_path / f"build-{name}-{gch.name}"
    build_dir.mkdir()
    compile_library(plan, build_dir, failed_log=tmp_path / "failed.log", headers=_Handing(gch))
    assert (build_dir / plan.library_file).is_file()
    return (build_dir / "build.log").read_text()


def _precompiled(stand_in: Path, tmp_path: Path, name: str = "pch_op_a", extra_flags=()) -> Path:
    """A .gch of the stand-in header, built as a run would build it for op ``name`` (with ``extra_flags``)."""
    header = precompiled_header.plan_header(plan_build(_op(name, extra_flags)(source_root=stand_in), Purpose.JIT))
    build_dir = tmp_path / f"gch-{header.key}"
    build_dir.mkdir()
    seconds, log = precompiled_cache.build(header, build_dir)
    assert seconds is not None, log
    return build_dir / GCH_FILE


def test_a_missing_header_falls_back_to_parsing_its_text(stand_in, tmp_path):
    log = _build_with(stand_in, tmp_path, tmp_path / "gone" / GCH_FILE)
    assert not _used(log) and precompiled_header.rejection(log) is None


def test_a_header_gcc_refuses_or_cannot_read_fails_no_build(stand_in, tmp_path, said):
    """Built with other code-generation flags (-O0 for a -O3 build), GCC refuses it and parses the
    text; cut short, GCC cannot read it at all (a fatal error) and the op is built again without it."""
    other_flags = _precompiled(stand_in, tmp_path, extra_flags=["-O0"])
    log = _build_with(stand_in, tmp_path, other_flags)
    assert "not used because" in (precompiled_header.rejection(log) or ""), log
    assert any("GCC did not use the precompiled torch headers" in line for line in said)

    truncated = tmp_path / "truncated.gch"
    truncated.write_bytes(other_flags.read_bytes()[:4096])
    log = _build_with(stand_in, tmp_path, truncated)
    assert any("did not build with the precompiled torch headers" in line for line in said), said
    assert not _used(log) and "-Winvalid-pch" not in log  # the second build: without it


def test_units_use_the_header_only_where_they_include_apex_op_h(stand_in, tmp_path):
    (stand_in / "pch_op_a" / "defines_first.cpp").write_text(DEFINES_FIRST)
    plan = plan_build(_op("pch_op_a")(source_root=stand_in), Purpose.JIT)
    header = precompiled_header.plan_header(plan)
    include_dirs = [Path(d) for d in plan.include_dirs]
    sources = list(plan.sources)
    assert [s.name for s in precompiled_header.units_using(header, sources, include_dirs)] == ["pch_op_a.cpp"]
    # A generated unity unit that holds a registration unit uses it.
    together = unity.group_sources([s for s in sources if s.name != "defines_first.cpp"], tmp_path, jobs=1)
    assert len(together) == 1 and precompiled_header.units_using(header, together, include_dirs) == together


def test_the_key_follows_flags_torch_compiler_and_header_but_not_the_op(stand_in, monkeypatch):
    import torch

    def key(name="pch_op_a", purpose=Purpose.JIT, fast=False, extra_flags=()):
        plan = plan_build(_op(name, extra_flags)(source_root=stand_in), purpose, fast=fast)
        return precompiled_header.plan_header(plan).key

    jit = key()
    assert key("pch_op_b") == jit                    # one header for every op (TORCH_EXTENSION_NAME is left out)
    assert key(extra_flags=[WITH_CUDA_DEFINE]) == jit  # nor does the GPU build's define change it
    assert key(purpose=Purpose.CHECK, fast=True) != jit  # -O0
    assert key(purpose=Purpose.PREBUILD) != jit        # no -march flags of this CPU
    assert key(extra_flags=["-DNDEBUG"]) != jit
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert key() != jit
    monkeypatch.undo()
    (stand_in / "include" / "apex" / "more.h").write_text("#pragma once\n#include <set>\n")
    assert key() != jit
    compiler = precompiled_header.gcc_identity(os.environ.get("CXX", "c++"))
    assert compiler["version"].startswith("gcc version") and compiler["binaries"]


def test_no_header_without_gcc_or_apexs_headers(stand_in, monkeypatch, tmp_path):
    plan = plan_build(_op("pch_op_a")(source_root=stand_in), Purpose.JIT)
    monkeypatch.setattr(precompiled_header, "gcc_identity", lambda compiler: None)  # clang, say
    assert precompiled_header.plan_header(plan) is None
    monkeypatch.undo()
    (stand_in / "include" / "apex" / "op.h").unlink()
    assert precompiled_header.plan_header(plan_build(_op("pch_op_a")(source_root=stand_in), Purpose.JIT)) is None


def test_only_the_two_most_recently_used_headers_are_kept(jit_cache):
    folder = jit_cache / precompiled_cache.CACHE_NAME
    folder.mkdir(mode=0o700)
    for age, key in enumerate(("a" * 20, "b" * 20, "c" * 20)):
        scratch = folder / f"scratch-{key}"
        scratch.mkdir()
        (scratch / GCH_FILE).write_bytes(b"gch")
        cache.publish(scratch, folder / key, {"op": precompiled_cache.CACHE_NAME}, library_file=GCH_FILE)
        os.utime(folder / key, (1000 - age, 1000 - age))  # "a" the most recently used
    precompiled_cache._keep_most_recent(folder, precompiled_cache.MAX_KEPT)
    assert sorted(p.name for p in folder.iterdir() if cache.is_entry(p)) == ["a" * 20, "b" * 20]


def test_a_check_of_several_ops_builds_one_header_for_the_run_and_leaves_nothing(stand_in, monkeypatch, said, capsys):
    builders = {name: _op(name)(source_root=stand_in) for name in ("pch_op_a", "pch_op_b")}
    monkeypatch.setattr(compile_check, "builder_for", builders.__getitem__)
    monkeypatch.delenv("APEX_PCH", raising=False)
    before = set(Path(tempfile.gettempdir()).glob("apex-pch-*"))
    assert compile_check.main(list(builders)) == 0, capsys.readouterr().err
    assert sum("precompiling torch's headers" in line for line in said) == 1
    assert set(Path(tempfile.gettempdir()).glob("apex-pch-*")) == before
    # One op alone: the header would cost more than it saves, unless asked for.
    assert precompiled_cache.for_run(1) is None
    monkeypatch.setenv("APEX_PCH", "1")
    assert isinstance(precompiled_cache.for_run(1), precompiled_cache.RunHeaders)
    monkeypatch.setenv("APEX_PCH", "0")
    assert precompiled_cache.for_run(1) is None
    assert isinstance(precompiled_cache.for_run(13), precompiled_cache.RunHeaders)  # the Python entry's object only


# ---- the Python entry's object (python_entry.py), shared the same way ------------------------------
STAND_IN_ENTRY_H = '#pragma once\nextern "C" __attribute__((visibility("hidden"))) int entry_answer();\n'
STAND_IN_ENTRY_CPP = '#include "apex/python_entry.h"\nextern "C" int entry_answer() { return 42; }\n'
USES_ENTRY = '#include "apex/python_entry.h"\nextern "C" int {name}_answer() {{ return entry_answer(); }}\n'


@pytest.fixture
def with_entry(stand_in: Path) -> Path:
    (stand_in / "include" / "apex" / "python_entry.h").write_text(STAND_IN_ENTRY_H)
    (stand_in / "include" / "apex" / "python_entry.cpp").write_text(STAND_IN_ENTRY_CPP)
    for name in ("pch_op_a", "pch_op_b"):
        (stand_in / name / f"{name}_entry.cpp").write_text(USES_ENTRY.format(name=name))
    return stand_in


def _objects(cache_dir: Path) -> list[Path]:
    folder = cache_dir / precompiled_cache.OBJECT_CACHE_NAME
    return sorted(p for p in folder.iterdir() if cache.is_entry(p)) if folder.is_dir() else []


@pytest.mark.parametrize("pch", ["auto", "0"])
def test_the_python_entry_is_compiled_once_and_linked_hidden_into_every_op(with_entry, jit_cache, said, monkeypatch,
                                                                           pch):
    import ctypes

    monkeypatch.setenv("APEX_PCH", pch)
    libraries = [load_builder(_op(name)(source_root=with_entry)) for name in ("pch_op_a", "pch_op_b")]
    (entry,) = _objects(jit_cache)
    assert sum("compiling apex's Python entry" in line for line in said) == 1, said
    for name, library in zip(("pch_op_a", "pch_op_b"), libraries):
        log = _build_log(jit_cache, name)
        assert "python_entry.cpp" not in log and f"/{python_entry.OBJECT_FILE} " in log, log  # linked (a copy)
        loaded = ctypes.CDLL(str(library))
        assert getattr(loaded, f"{name}_answer")() == 42
        with pytest.raises(AttributeError):
            loaded.entry_answer  # hidden: each library keeps its own
    (meta,) = [meta for path, meta in cache.apex_files(jit_cache) if path == entry]
    assert meta["op"] == precompiled_cache.OBJECT_CACHE_NAME


class _Timed(precompiled_cache.RunHeaders):
    """One run's shared builds, each made slow enough (0.5 s more) that overlapping ones show."""

    def __init__(self):
        super().__init__()
        self.spans: dict[str, tuple[float, float]] = {}

    def _timed(self, name, build, plan):
        import time

        started = time.monotonic()
        time.sleep(0.5)
        built = build(plan)
        self.spans[name] = (started, time.monotonic())
        return built

    def gch_for(self, header):
        return self._timed("header", super().gch_for, header)

    def object_for(self, obj):
        return self._timed("object", super().object_for, obj)


@pytest.mark.parametrize("jobs", ["2", "1"])
def test_the_header_and_the_python_entry_build_side_by_side_given_a_second_job(with_entry, tmp_path, monkeypatch,
                                                                              jobs):
    monkeypatch.setenv("MAX_JOBS", jobs)
    plan = plan_build(_op("pch_op_a")(source_root=with_entry), Purpose.CHECK)
    build_dir = tmp_path / "build"
    build_dir.mkdir()
    with _Timed() as headers:
        compile_library(plan, build_dir, failed_log=tmp_path / "failed.log", headers=headers)
        (header_start, header_end), (object_start, object_end) = headers.spans["header"], headers.spans["object"]
    overlap = min(header_end, object_end) - max(header_start, object_start)
    assert (overlap > 0.4) == (jobs == "2"), headers.spans  # one job: one after the other
    log = (build_dir / "build.log").read_text()
    assert _used(log) and f"/{python_entry.OBJECT_FILE} " in log  # both used, as one after the other


def test_without_a_shared_object_the_python_entry_is_one_of_the_ops_units(with_entry, tmp_path, monkeypatch):
    monkeypatch.setenv("MAX_JOBS", "4")  # each source a unit of its own (unity.py)
    plan = plan_build(_op("pch_op_a")(source_root=with_entry), Purpose.CHECK)
    build_dir = tmp_path / "build"
    build_dir.mkdir()
    compile_library(plan, build_dir, failed_log=tmp_path / "failed.log", headers=None)
    assert f"-c {with_entry / 'include' / 'apex' / 'python_entry.cpp'}" in (build_dir / "build.log").read_text()


def test_the_python_entrys_key_follows_its_sources_and_flags_but_not_the_op(with_entry):
    key = lambda name: python_entry.plan_object(plan_build(_op(name)(source_root=with_entry), Purpose.JIT)).key
    first = key("pch_op_a")
    assert key("pch_op_b") == first
    (with_entry / "include" / "apex" / "python_entry.cpp").write_text(STAND_IN_ENTRY_CPP + "// edited\n")
    assert key("pch_op_a") != first


def test_apex_op_h_leaves_torchs_python_bindings_to_the_python_entry():
    """pybind11 (through torch/csrc/Exceptions.h or python_variable.h) costs every unit that includes it
    ~5 s of code generation at -O3: none of it in op.h, the precompiled header or a registration unit."""
    include = REPO / "csrc" / "include"
    included = precompiled_header.precompilable_includes(include / "apex" / "autograd.h", [include])
    assert "Python.h" in included
    python_bindings = [name for name in included if name.startswith("pybind11/") or name in (
        "torch/csrc/Exceptions.h", "torch/python.h", "torch/extension.h")
        or (name.startswith("torch/csrc/") and "python" in name.lower())]
    assert python_bindings == []


@pytest.mark.slow
def test_torchs_real_headers_are_precompiled_and_used_with_the_flags_torch_gives_an_op(tmp_path, monkeypatch):
    """The real thing: a small op that includes apex/op.h, with the GPU build's define, against torch's
    headers; GCC must use the .gch (the build log has no -Winvalid-pch warning). In the configured
    cache, as the op tests build there: the suite precompiles torch's headers once, for every op."""
    monkeypatch.delenv("APEX_PCH", raising=False)
    root = tmp_path / "real"
    (root / "pch_real").mkdir(parents=True)
    (root / "pch_real" / "pch_real.cpp").write_text(
        '#include "apex/op.h"\nat::Tensor pch_real_twice(const at::Tensor& x) { return x.mul(2); }\n')

    class RealHeaders(CppOpBuilder):
        NAME = "apex_test_pch_real"
        SOURCE_DIR = "pch_real"
        EXTRA_CXX_FLAGS = [WITH_CUDA_DEFINE]  # left out of the header's flags, as in a GPU build

        def include_dirs(self):
            return [REPO / "csrc" / "include"]

    library = load_builder(RealHeaders(source_root=root))
    try:
        log = (library.parent / "build.log").read_text()
        # The registration unit was compiled through the generated file that includes the header first.
        assert "-Winvalid-pch" in log and f"-c {root / 'pch_real' / 'pch_real.cpp'}" not in log, log[-3000:]
        assert precompiled_header.rejection(log) is None, precompiled_header.rejection(log)
        header = precompiled_header.plan_header(plan_build(RealHeaders(source_root=root), Purpose.JIT))
        for torch_header in ("torch/library.h", "torch/csrc/autograd/function.h"):
            assert f"#include <{torch_header}>" in header.text
        gch = cache.entry(precompiled_cache.CACHE_NAME, header.key) / GCH_FILE
        assert cache.entry_problem(gch.parent, precompiled_cache.CACHE_NAME, GCH_FILE) is None
    finally:
        cache.discard(library.parent)  # the test op's library; the header stays, for the real ops
        if not any(library.parent.parent.iterdir()):
            library.parent.parent.rmdir()
