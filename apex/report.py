"""Environment report for bug reports and build problems: `python -m apex.report` (or `apex-report`).

Prints torch, CUDA/HIP, nvcc, ninja, the C++ compiler, the GPUs, the cache dir,
then one row per op: compatible (or why not), prebuilt / cached / not built, its
prebuild variable. `--op-table` prints the README's op table instead.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys


def _first_line(command: list[str]) -> str:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "not found"


def environment() -> list[tuple[str, str]]:
    import torch

    from op_builder import cache, toolchain

    nvcc = toolchain.nvcc()
    gpus = [f"{torch.cuda.get_device_name(i)} (sm_{''.join(map(str, torch.cuda.get_device_capability(i)))})"
            for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    try:
        cache_dir = str(cache.root())
    except PermissionError as error:
        cache_dir = f"REFUSED: {error}"
    return [
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("torch", f"{torch.__version__} ({os.path.dirname(torch.__file__)})"),
        ("torch CUDA / HIP", f"{torch.version.cuda or '-'} / {torch.version.hip or '-'}"),
        ("nvcc", f"{nvcc} (CUDA {toolchain.nvcc_version(nvcc)})" if nvcc else "not found"),
        ("ninja", toolchain.ninja() or "not found"),
        ("C++ compiler", f"{toolchain.cxx_compiler() or 'not found'}: {_first_line([os.environ.get('CXX', 'c++'), '--version'])}"),
        ("GPUs", ", ".join(gpus) or "none visible"),
        ("TORCH_CUDA_ARCH_LIST", os.environ.get("TORCH_CUDA_ARCH_LIST", "(unset: the visible GPUs' archs)")),
        ("cache dir", cache_dir),
    ]


def op_rows() -> list[tuple[str, str, str, str]]:
    """(op, compatible, status, prebuild variable) for every registered op."""
    from op_builder import all_builders
    from op_builder.jit import build_status

    rows = []
    for name, cls in all_builders().items():
        builder = cls()
        compatible, reason = builder.is_compatible()
        status = build_status(builder) if compatible else "-"
        rows.append((name, "yes" if compatible else f"no: {reason}", status, cls.build_var()))
    return rows


def op_table_markdown() -> str:
    """The op table README.md shows (a test keeps the two equal)."""
    from op_builder import all_builders

    lines = ["| module | kind | what it does | prebuild variable |", "| --- | --- | --- | --- |"]
    for name, cls in all_builders().items():
        kind = "C++ (CPU; CUDA tensors via ATen)" if cls.GROUP == "CPP" else "C++ CPU + CUDA kernels"
        lines.append(f"| `{name}` | {kind} | {cls.description()} | `{cls.build_var()}` |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="apex-report", description=__doc__.splitlines()[0])
    parser.add_argument("--op-table", action="store_true", help="print README.md's op table (markdown)")
    args = parser.parse_args(argv)
    if args.op_table:
        print(op_table_markdown())
        return 0
    print("apex environment")
    for key, value in environment():
        print(f"  {key:<22} {value}")
    print("\nops")
    rows = op_rows()
    header = ("op", "compatible", "status", "prebuild with")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(4)]
    for row in [header] + rows:
        print("  " + "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
