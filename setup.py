"""Install apex.

`pip install .` copies Python files and the C++/CUDA sources: nothing compiles,
torch is not imported, it takes seconds. Each op compiles on first use.
`APEX_BUILD_<OP>=1 pip install --no-build-isolation .` (or APEX_BUILD_CUDA_OPS=1 /
APEX_BUILD_CPP_OPS=1) compiles those ops into the wheel now; see README.md.
"""
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))  # op_builder itself decides what to prebuild

from op_builder import prebuild  # noqa: E402  (imports no torch unless a prebuild is asked for)

ext_modules, cmdclass = prebuild.extensions(source_root=Path("csrc"))

setup(
    # compatibility/*.py are the historical top-level module names (apex_C, amp_C, ...).
    py_modules=sorted(p.stem for p in (ROOT / "compatibility").glob("*.py")),
    packages=find_packages(include=["apex", "apex.*", "op_builder", "op_builder.*"]) + ["op_builder.csrc"],
    package_dir={"": "compatibility", "apex": "apex", "op_builder": "op_builder", "op_builder.csrc": "csrc"},
    # The sources travel with the package: first use compiles them.
    package_data={"op_builder.csrc": ["**/*"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    zip_safe=False,
)
