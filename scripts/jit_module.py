#!/usr/bin/env python3
"""Scaffold a new apex op in one command.

    python scripts/jit_module.py NAME [--cpu-only] [--sources FILE ...] [--description TEXT]

Creates, ready to build and pass its test without edits:
    csrc/NAME/NAME.h, NAME.cpp, NAME_cpu.cpp[, NAME_cuda.cu]   schema + pybind face, CPU kernel, CUDA kernel
    op_builder/ops/NAME.py                                       its builder (APEX_BUILD_NAME derives from it)
    compatibility/NAME.py                                        `import NAME` loads it lazily
    tests/compatibility/test_NAME.py                             CPU test (+ CUDA under the gpu marker)
The example kernel is out = alpha * x; replace it with yours. --sources copies existing
.cpp/.cu files into csrc/NAME/ and adds them to the build. Asks for what is missing only
when run interactively; refuses a name that already exists.
"""
from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = Path(__file__).resolve().parent / "op_template"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _ask(prompt: str) -> str:
    if not sys.stdin.isatty():
        raise SystemExit(f"jit_module.py: missing {prompt} (pass it as an argument; see --help)")
    return input(f"{prompt}: ").strip()


def scaffold(root: Path, name: str, cpu_only: bool, extra_sources: list[Path], description: str) -> list[Path]:
    """Write the op's files under ``root``; return them. Refuses to overwrite anything."""
    if not _IDENTIFIER.match(name):
        raise SystemExit(f"jit_module.py: '{name}' is not a valid Python module name")
    builder_file = root / "op_builder" / "ops" / f"{name}.py"
    outputs = {
        root / "csrc" / name / f"{name}.h": "op.h.tmpl",
        root / "csrc" / name / f"{name}.cpp": "op.cpp.tmpl",
        root / "csrc" / name / f"{name}_cpu.cpp": "op_cpu.cpp.tmpl",
        builder_file: "builder.py.tmpl",
        root / "compatibility" / f"{name}.py": "compat.py.tmpl",
        root / "tests" / "compatibility" / f"test_{name}.py": "test_op.py.tmpl",
    }
    if not cpu_only:
        outputs[root / "csrc" / name / f"{name}_cuda.cu"] = "op_cuda.cu.tmpl"
    taken = [p for p in [*outputs, root / "csrc" / name] if p.exists()] + _declared_elsewhere(root, name)
    if taken:
        raise SystemExit(f"jit_module.py: op '{name}' already exists ({', '.join(map(str, taken))}); pick another name")
    for source in extra_sources:
        if not source.is_file():
            raise SystemExit(f"jit_module.py: --sources: {source} is not a file")

    cpp = [f"{name}/{name}.cpp", f"{name}/{name}_cpu.cpp"] + [f"{name}/{s.name}" for s in extra_sources if s.suffix != ".cu"]
    cuda = [] if cpu_only else [f"{name}/{name}_cuda.cu"] + [f"{name}/{s.name}" for s in extra_sources if s.suffix == ".cu"]
    values = {
        "name": name,
        "description": description,
        "class_name": "".join(part.capitalize() for part in name.split("_")) + "Builder",
        "builder_base": "CppOpBuilder" if cpu_only else "CUDAOpBuilder",
        "cpp_sources": repr(cpp),
        "cuda_sources": repr(cuda),
    }
    for path, template in outputs.items():
        text = (TEMPLATES / template).read_text()
        for key, value in values.items():
            text = text.replace("{{" + key + "}}", value)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for source in extra_sources:
        shutil.copy2(source, root / "csrc" / name / source.name)
    return sorted(outputs) + [root / "csrc" / name / s.name for s in extra_sources]


def _declared_elsewhere(root: Path, name: str) -> list[Path]:
    """Builder files that already declare NAME = "<name>" (another file name, same op)."""
    pattern = re.compile(rf"^\s*NAME\s*=\s*['\"]{re.escape(name)}['\"]", re.MULTILINE)
    return [p for p in (root / "op_builder" / "ops").glob("*.py") if pattern.search(p.read_text())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", nargs="?", help="module name of the new op (e.g. my_fused_op)")
    parser.add_argument("--cpu-only", action="store_true", help="C++ only: no CUDA kernel")
    parser.add_argument("--sources", nargs="*", type=Path, default=[], help="existing .cpp/.cu files to add")
    parser.add_argument("--description", help="one line for the op table")
    parser.add_argument("--root", type=Path, default=REPO, help=argparse.SUPPRESS)  # tests scaffold into a copy
    args = parser.parse_args(argv)
    name = args.name or _ask("op name")
    description = args.description or ("scaled copy (scaffolded example op)" if args.name else
                                       _ask("one-line description") or "scaled copy (scaffolded example op)")
    written = scaffold(args.root, name, args.cpu_only, args.sources, description)
    print(f"Scaffolded op '{name}':")
    for path in written:
        print(f"  {path.relative_to(args.root)}")
    print(f"Try it: python -m pytest tests/compatibility/test_{name}.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
