"""Unity translation units (apex.op_builder.unity): C++ sources merged into one unit per build job
when an op has more of them than the build has jobs."""
import re

from apex.op_builder import unity
from apex.op_builder.compiler import compile_library
from apex.op_builder.plan import Purpose, plan_build
from apex.op_builder.registry import builder_for


def _sources(tmp_path, sizes, extra=()):
    paths = []
    for index, size in enumerate(sizes):
        path = tmp_path / "src" / f"part{index}.cpp"
        path.parent.mkdir(exist_ok=True)
        path.write_text("//" + "x" * size + "\n")
        paths.append(path)
    for name in extra:
        path = tmp_path / "src" / name
        path.write_text("// device code\n")
        paths.append(path)
    return paths


def _included(unit):
    return re.findall(r'#include "([^"]+)"', unit.read_text())


def test_no_more_sources_than_jobs_are_left_alone(tmp_path):
    sources = _sources(tmp_path, [10, 20], extra=["kernels.cu"])
    assert unity.group_sources(sources, tmp_path, jobs=2) == sources
    assert not list(tmp_path.glob(f"{unity.UNITY_PREFIX}*"))


def test_more_sources_than_jobs_become_one_unit_per_job(tmp_path):
    sources = _sources(tmp_path, [500, 10, 300, 20, 200], extra=["kernels.cu"])
    grouped = unity.group_sources(sources, tmp_path, jobs=2)
    units, rest = grouped[:2], grouped[2:]
    assert rest == [sources[-1]]  # nvcc's sources stay their own units
    assert [u.name for u in units] == [f"{unity.UNITY_PREFIX}0.cpp", f"{unity.UNITY_PREFIX}1.cpp"]
    included = [_included(u) for u in units]
    # Every C++ source exactly once, by absolute path, in its original order within a unit.
    assert sorted(p for unit in included for p in unit) == sorted(str(s.resolve()) for s in sources[:-1])
    order = [str(s.resolve()) for s in sources]
    for unit in included:
        assert unit == sorted(unit, key=order.index)
    # Balanced by size, largest first: {503, 23} and {303, 203, 13} bytes (each file adds 3).
    assert sorted(len(unit) for unit in included) == [2, 3]


def test_jobs_are_max_jobs_else_the_cores(monkeypatch):
    monkeypatch.setenv("MAX_JOBS", "3")
    assert unity.build_jobs() == 3
    for unusable in ("", "0", "many"):
        monkeypatch.setenv("MAX_JOBS", unusable)
        assert unity.build_jobs() >= 1
    monkeypatch.delenv("MAX_JOBS")
    assert unity.build_jobs() >= 1


def test_the_op_with_the_most_sources_compiles_as_one_unit(tmp_path, monkeypatch):
    """All of fused_dense's C++ files in one unit: the strictest test that an op's files can share
    one (no clashing private names), which a 2-core build relies on."""
    monkeypatch.setenv("MAX_JOBS", "1")
    plan = plan_build(builder_for("fused_dense"), Purpose.JIT)
    assert sum(s.suffix == ".cpp" for s in plan.sources) > 1
    compile_library(plan, tmp_path, failed_log=tmp_path / "failed.log")
    assert (tmp_path / f"{unity.UNITY_PREFIX}0.cpp").exists() and (tmp_path / plan.library_file).exists()
