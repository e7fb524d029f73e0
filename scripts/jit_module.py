#!/usr/bin/env python3
"""Scaffold a new apex op in one command.

    python scripts/jit_module.py NAME [--cpu-only] [--package apex.contrib] [--description TEXT]

Writes exactly these, ready to build and pass their tests without edits:
    csrc/NAME/NAME.h, NAME.cpp, NAME_cpu.cpp[, NAME_cuda.cu]   kernel args, the op (schema, checks,
                                                                 autograd), CPU and CUDA kernels
    op_builder/ops/NAME.py                                       its builder (APEX_BUILD_NAME derives from it)
    compatibility/NAME.py                                        `import NAME`: the historical face
    <package>/NAME/__init__.py                                   the Python API (default apex.contrib.NAME)
    tests/<package as a path>/NAME/test_NAME.py                  CPU tests (+ CUDA under the gpu marker)
Nothing else lists ops: the registry finds the builder, sources are found by convention, and the
README's op table is regenerated from the registry. The example op is a differentiable
`alpha * x` (torch.ops.apex.NAME_scale); replace it with yours. Refuses a name that already exists
or that would shadow an importable module (torch, numpy, ...).
"""
from __future__ import annotations

import argparse
import importlib.util
import keyword
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = Path(__file__).resolve().parent / "op_template"
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*$")
# Names an op module must never take even where they are not installed: importing them would
# then load the op instead of the library a user expects.
_RESERVED = {"apex", "torch", "numpy", "op_builder", "compatibility", "test", "tests", "setup", "triton"}


def _ask(prompt: str) -> str:
    if not sys.stdin.isatty():
        raise SystemExit(f"jit_module.py: missing {prompt} (pass it as an argument; see --help)")
    return input(f"{prompt}: ").strip()


def _refuse_name(root: Path, name: str) -> None:
    if not _IDENTIFIER.match(name) or keyword.iskeyword(name):
        raise SystemExit(f"jit_module.py: '{name}' is not a valid module name (lower case, digits, _)")
    if name in _RESERVED or name in sys.stdlib_module_names or name in sys.builtin_module_names:
        raise SystemExit(f"jit_module.py: '{name}' would shadow the module of that name; pick another name")
    if importlib.util.find_spec(name) is not None:
        raise SystemExit(f"jit_module.py: '{name}' is already importable here "
                         f"({importlib.util.find_spec(name).origin}); pick another name")
    pattern = re.compile(rf"^\s*NAME\s*=\s*['\"]{re.escape(name)}['\"]", re.MULTILINE)
    declared = [p for p in (root / "op_builder" / "ops").glob("*.py") if pattern.search(p.read_text())]
    if declared:
        raise SystemExit(f"jit_module.py: op '{name}' already exists ({', '.join(map(str, declared))})")


def scaffold(root: Path, name: str, cpu_only: bool, package: str, description: str) -> list[Path]:
    """Write the op's files under ``root``; return them. Refuses to overwrite anything."""
    _refuse_name(root, name)
    package_dir = root.joinpath(*package.split("."))
    outputs = {
        root / "csrc" / name / f"{name}.h": "op.h.tmpl",
        root / "csrc" / name / f"{name}.cpp": "op.cpp.tmpl",
        root / "csrc" / name / f"{name}_cpu.cpp": "op_cpu.cpp.tmpl",
        root / "op_builder" / "ops" / f"{name}.py": "builder.py.tmpl",
        root / "compatibility" / f"{name}.py": "compat.py.tmpl",
        package_dir / name / "__init__.py": "api.py.tmpl",
        root / "tests" / package_dir.relative_to(root) / name / f"test_{name}.py": "test_op.py.tmpl",
    }
    if not cpu_only:
        outputs[root / "csrc" / name / f"{name}_cuda.cu"] = "op_cuda.cu.tmpl"
    taken = [p for p in [*outputs, root / "csrc" / name, package_dir / name] if p.exists()]
    if taken:
        raise SystemExit(f"jit_module.py: op '{name}' already exists ({', '.join(map(str, taken))}); pick another name")

    values = {
        "name": name,
        "description": description,
        "class_name": "".join(part.capitalize() for part in name.split("_")) + "Builder",
        "builder_base": "CppOpBuilder" if cpu_only else "CUDAOpBuilder",
        "api_module": f"{package}.{name}",
        "cuda_declaration": "" if cpu_only else f"void scale(const Cuda&, const ScaleArgs&);  // {name}_cuda.cu\n",
    }
    for path, template in outputs.items():
        text = (TEMPLATES / template).read_text()
        for key, value in values.items():
            text = text.replace("{{" + key + "}}", value)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return sorted(outputs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", nargs="?", help="module name of the new op (e.g. my_fused_op)")
    parser.add_argument("--cpu-only", action="store_true", help="C++ only: no CUDA kernel")
    parser.add_argument("--package", default="apex.contrib", help="package that gets the Python API (default apex.contrib)")
    parser.add_argument("--description", help="one line for the op table")
    parser.add_argument("--root", type=Path, default=REPO, help=argparse.SUPPRESS)  # tests scaffold into a copy
    args = parser.parse_args(argv)
    name = args.name or _ask("op name")
    description = args.description or ("scaled copy (scaffolded example op)" if args.name else
                                       _ask("one-line description") or "scaled copy (scaffolded example op)")
    written = scaffold(args.root, name, args.cpu_only, args.package, description)
    print(f"Scaffolded op '{name}':")
    for path in written:
        print(f"  {path.relative_to(args.root)}")
    test = next(p for p in written if p.name == f"test_{name}.py")
    print(f"Try it: python -m pytest {test.relative_to(args.root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
