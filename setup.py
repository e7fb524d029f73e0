"""Install apex.

`pip install .` copies Python files and the C++/CUDA sources: nothing compiles, torch is not
imported, it takes seconds. Each op compiles on first use. `APEX_BUILD_<OP>=1 pip install
--no-build-isolation .` (or APEX_BUILD_CUDA_OPS=1 / APEX_BUILD_CPP_OPS=1) compiles those ops into
the wheel now; see README.md.

The wheel holds `apex` (the builder inside it, as apex.op_builder, with the sources as
apex/op_builder/csrc) and, at top level, only the historical module names (compatibility/*.py).
setuptools' scratch space (build/, *.egg-info) goes to a temporary directory removed on exit, so
nothing is left in the source tree and no stale file from an earlier install reaches a wheel.
"""
import atexit
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _builder_package():
    """apex.op_builder from op_builder/ (the builder decides what to prebuild). Loaded by path, as
    the wheel will lay it out: an sdist has no apex/op_builder link. Imports no torch."""
    sys.path.insert(0, str(ROOT))
    import apex  # noqa: F401  (imports nothing)

    spec = importlib.util.spec_from_file_location("apex.op_builder", ROOT / "op_builder" / "__init__.py",
                                                  submodule_search_locations=[str(ROOT / "op_builder")])
    package = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = package
    spec.loader.exec_module(package)
    return package


prebuild = importlib.import_module(f"{_builder_package().__name__}.prebuild")

SCRATCH = tempfile.mkdtemp(prefix="apex-setup-")
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)


class BuildPyWithBuildInfo(build_py):
    """Also writes apex/op_builder/_build_info.json (version, commit) for `apex-report`."""

    def run(self) -> None:
        super().run()
        info = {"version": self.distribution.get_version(), "commit": _git("rev-parse", "HEAD"),
                "modified": bool(_git("status", "--porcelain", "--untracked-files=no"))}
        target = Path(self.build_lib, "apex", "op_builder", "_build_info.json")
        target.write_text(json.dumps(info, indent=2))


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


setup(
    # compatibility/*.py are the historical top-level module names (apex_C, amp_C, ...).
    py_modules=sorted(p.stem for p in (ROOT / "compatibility").glob("*.py")),
    packages=find_packages(include=["apex", "apex.*"], exclude=["apex.op_builder", "apex.op_builder.*"])
    + ["apex.op_builder", "apex.op_builder.ops", "apex.op_builder.csrc"],
    package_dir={"": "compatibility", "apex": "apex", "apex.op_builder": "op_builder", "apex.op_builder.csrc": "csrc"},
    # The sources travel with the package: first use compiles them.
    package_data={"apex.op_builder.csrc": ["**/*"]},
    ext_modules=prebuild.placeholder_extensions(),
    cmdclass={"build_ext": prebuild.BuildPrebuiltOps, "build_py": BuildPyWithBuildInfo},
    options={"build": {"build_base": str(Path(SCRATCH, "build"))}, "egg_info": {"egg_base": SCRATCH}},
    zip_safe=False,
)
