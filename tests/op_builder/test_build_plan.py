"""One BuildPlan per build: sources by convention, flags, archs, GPU or not, the cache key."""
import pytest
import torch

from apex.op_builder import all_builders, archs
from apex.op_builder.builder import CppOpBuilder, CUDAOpBuilder, OpBuilder
from apex.op_builder.plan import WITH_CUDA_DEFINE, Purpose, plan_build


class Kernels(CUDAOpBuilder):
    """Kernels of a test op."""

    NAME = "kernels_op"


@pytest.fixture
def csrc(tmp_path):
    """A source root with one op folder (two .cpp, two .cu, a header, a subfolder) and a shared folder."""
    root = tmp_path / "csrc"
    for name in ("kernels_op/a.cpp", "kernels_op/b.cpp", "kernels_op/a.cu", "kernels_op/b.cu", "kernels_op/k.h",
                 "kernels_op/notes/skip.cpp", "shared/common.cpp", "shared/common.cu", "include/apex/x.h"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"// {name}\n")
    return root


@pytest.fixture
def cuda_torch(monkeypatch):
    """A CUDA build of torch, whether or not this one is."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.version, "hip", None)


def _names(plan):
    return [str(s.relative_to(s.parents[1])) for s in plan.sources]


def test_sources_by_convention_cpp_always_cu_in_gpu_builds(csrc, cuda_torch):
    builder = Kernels(source_root=csrc)
    assert _names(plan_build(builder, Purpose.PREBUILD)) == ["kernels_op/a.cpp", "kernels_op/b.cpp",
                                                             "kernels_op/a.cu", "kernels_op/b.cu"]
    cpu_only = plan_build(builder, Purpose.JIT) if not torch.cuda.is_available() else None
    if cpu_only is not None:  # no GPU visible: the JIT build is CPU only
        assert _names(cpu_only) == ["kernels_op/a.cpp", "kernels_op/b.cpp"] and not cpu_only.with_gpu


def test_a_cpp_builder_never_compiles_cu_files(csrc):
    class CppOnly(CppOpBuilder):
        NAME = "kernels_op"

    plan = plan_build(CppOnly(source_root=csrc), Purpose.PREBUILD)
    assert not plan.with_gpu and all(s.suffix == ".cpp" for s in plan.sources)


def test_source_dir_extra_dirs_and_explicit_lists(csrc, cuda_torch):
    class Shared(Kernels):
        NAME = "other_name"
        SOURCE_DIR = "kernels_op"
        EXTRA_SOURCE_DIRS = ["shared"]

    plan = plan_build(Shared(source_root=csrc), Purpose.PREBUILD)
    assert "shared/common.cpp" in _names(plan) and "shared/common.cu" in _names(plan)
    before = plan.key
    (csrc / "shared" / "common.cpp").write_text("// changed\n")
    assert plan_build(Shared(source_root=csrc), Purpose.PREBUILD).key != before  # extra dirs are hashed

    class Listed(Kernels):
        CPP_SOURCES = ["kernels_op/a.cpp"]
        CUDA_SOURCES = []

    assert _names(plan_build(Listed(source_root=csrc), Purpose.PREBUILD)) == ["kernels_op/a.cpp"]


def test_any_file_of_the_op_folder_or_the_shared_headers_changes_the_key(csrc, cuda_torch):
    builder = Kernels(source_root=csrc)
    keys = {plan_build(builder, Purpose.PREBUILD).key}
    for touched in ("kernels_op/k.h", "kernels_op/notes/skip.cpp", "include/apex/x.h"):
        (csrc / touched).write_text("// edited\n")
        keys.add(plan_build(builder, Purpose.PREBUILD).key)
    (csrc / "kernels_op" / "c.cpp").write_text("// a new file\n")
    keys.add(plan_build(builder, Purpose.PREBUILD).key)
    assert len(keys) == 5


def test_gpu_builds_define_apex_with_cuda_in_cxx_and_nvcc_flags_cpu_builds_do_not(csrc, cuda_torch):
    gpu = plan_build(Kernels(source_root=csrc), Purpose.PREBUILD)
    assert gpu.with_gpu and WITH_CUDA_DEFINE in gpu.cxx_flags and WITH_CUDA_DEFINE in gpu.nvcc_flags
    assert "-O3" in gpu.nvcc_flags and "--expt-relaxed-constexpr" in gpu.nvcc_flags

    class CppOnly(CppOpBuilder):
        NAME = "kernels_op"

    cpu = plan_build(CppOnly(source_root=csrc), Purpose.JIT)
    assert WITH_CUDA_DEFINE not in cpu.cxx_flags and cpu.nvcc_flags == ()
    assert ("-fopenmp" in cpu.cxx_flags) == torch._C.has_openmp
    # The define follows from "gpu": it is not a fingerprint flag (a prebuilt GPU library still
    # serves a CPU-only machine with the same torch).
    assert WITH_CUDA_DEFINE not in gpu.fingerprint["cxx_flags"] and gpu.fingerprint["gpu"]


def test_one_decision_for_gpu_kernels_per_purpose(csrc, cuda_torch, monkeypatch):
    builder = Kernels(source_root=csrc)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not plan_build(builder, Purpose.JIT).with_gpu       # nothing to run them on here
    assert plan_build(builder, Purpose.PREBUILD).with_gpu      # a wheel serves GPU machines
    assert plan_build(builder, Purpose.CHECK).with_gpu         # checks are about the CUDA sources


def test_prebuild_and_check_target_the_arch_list(csrc, cuda_torch, monkeypatch):
    builder = Kernels(source_root=csrc)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    assert plan_build(builder, Purpose.PREBUILD).archs == archs.DEFAULT_CUDA_ARCHS
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0 9.0+PTX")
    plan = plan_build(builder, Purpose.CHECK)
    assert plan.archs == "8.0;9.0+PTX" and plan.fingerprint["archs"] == plan.archs


def test_fast_check_compiles_ptx_only_without_optimisation(csrc, cuda_torch, monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    fast = plan_build(Kernels(source_root=csrc), Purpose.CHECK, fast=True)
    assert "-gencode=arch=compute_80,code=compute_80" in fast.nvcc_flags
    assert "-gencode=arch=compute_90,code=compute_90" in fast.nvcc_flags
    assert not [f for f in fast.nvcc_flags if "code=sm_" in f]
    assert "-O3" not in fast.nvcc_flags and "-O3" not in fast.cxx_flags
    assert WITH_CUDA_DEFINE in fast.nvcc_flags and WITH_CUDA_DEFINE in fast.cxx_flags


def test_the_child_gets_the_plan_as_it_is(csrc, cuda_torch, tmp_path):
    plan = plan_build(Kernels(source_root=csrc), Purpose.PREBUILD)
    spec = plan.child_spec(tmp_path)
    assert spec["sources"] == [str(s) for s in plan.sources] and spec["cxx_flags"] == list(plan.cxx_flags)
    assert spec["nvcc_flags"] == list(plan.nvcc_flags) and spec["with_gpu"] is True
    assert spec["build_dir"] == str(tmp_path) and plan.library_file == "kernels_op.so"


def test_builder_declares_its_face_and_description():
    assert Kernels.description() == "Kernels of a test op."
    assert Kernels.FACE_PREFIX is None and Kernels.FACE_MODULE is None
    assert Kernels.build_var() == "APEX_BUILD_KERNELS_OP" and Kernels.group_var() == "APEX_BUILD_CUDA_OPS"
    assert OpBuilder.after_load(Kernels()) is None  # the default hook does nothing


@pytest.mark.parametrize("name", sorted(all_builders()))
def test_every_registered_op_finds_sources_in_its_folder(name):
    builder = all_builders()[name]()
    plan = plan_build(builder, Purpose.PREBUILD)
    assert plan.sources, f"op {name} found no sources in {builder.source_dirs()}"
    assert all(s.is_file() for s in plan.sources)
    assert any(s.suffix == ".cu" for s in plan.sources) == builder.has_gpu_kernels()
