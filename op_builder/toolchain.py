"""What the machine has for compiling ops: C++ compiler, ninja, nvcc/hipcc.

Checked before a build starts, so a missing tool gives a one-line hint instead
of a compiler log. Nothing here imports torch at module import time.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from op_builder.errors import OpBuildError


def cxx_compiler(env=os.environ) -> str | None:
    """Path of the C++ compiler torch's extension builder will call ($CXX or c++)."""
    return shutil.which(env.get("CXX", "c++"), path=env.get("PATH"))


def ninja(env=os.environ) -> str | None:
    return shutil.which("ninja", path=env.get("PATH"))


def cuda_home(env=os.environ) -> Path | None:
    """The CUDA toolkit root: $CUDA_HOME, $CUDA_PATH, else where the nvcc on PATH says it lives.

    nvcc is asked (not just located) because it is often a wrapper script or a
    symlink outside the toolkit (/usr/local/bin/nvcc), whose parent has no lib64/.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            return Path(env[var])
    nvcc_on_path = shutil.which("nvcc", path=env.get("PATH"))
    return _toolkit_root(nvcc_on_path) if nvcc_on_path else None


@functools.lru_cache(maxsize=None)
def _toolkit_root(nvcc_path: str) -> Path:
    try:
        out = subprocess.run([nvcc_path, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=60)
        match = re.search(r"^#\$ TOP=(.+)$", out.stdout + out.stderr, re.MULTILINE)
        if match:
            return Path(match.group(1).strip()).resolve()
    except (OSError, subprocess.SubprocessError):
        pass
    return Path(nvcc_path).resolve().parent.parent


def nvcc(env=os.environ) -> str | None:
    home = cuda_home(env)
    candidate = home / "bin" / "nvcc" if home else None
    return str(candidate) if candidate and candidate.exists() else None


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc_path: str) -> str | None:
    """'13.0' from `nvcc --version`, or None if it cannot be run."""
    try:
        out = subprocess.run([nvcc_path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def cuda_library_header_dirs(env=os.environ) -> list[str]:
    """Header dirs of CUDA libraries installed as pip wheels beside torch (nvidia/*/include).

    torch's headers include cuSPARSE/cuBLAS headers that a bare nvcc install (no
    full toolkit) lacks; the wheels torch depends on carry them. Empty when the
    toolkit has them itself.
    """
    home = cuda_home(env)
    if home and any((home / sub / "cusparse.h").exists() for sub in ("include", "targets/x86_64-linux/include")):
        return []
    try:
        import nvidia  # namespace package of NVIDIA's CUDA wheels
    except ImportError:
        return []
    return sorted(str(d) for base in nvidia.__path__ for d in Path(base).glob("*/include") if d.is_dir())


def openmp_flags() -> list[str]:
    """-fopenmp when torch runs on OpenMP: at::parallel_for is inline in ATen's headers, a
    `#pragma omp parallel` that without the flag compiles to a serial loop (amp_C's CPU kernels
    ran on one thread). Not linked: the symbols resolve to the OpenMP runtime torch loads."""
    import torch

    return ["-fopenmp"] if torch._C.has_openmp else []


# x86-64 flags (and the macros that make ATen's at::vec::Vectorized use its AVX2 code) for
# the C++ CPU kernels, as torch builds its own AVX2 kernels. Without them Vectorized is
# ATen's generic scalar fallback: amp_C's CPU AdamW ran 10x slower (47 vs 4.7 ms for 4.2M
# params, benchmarks/optimizers/bench_cpu_adam.py).
_AVX2_FLAGS = ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2"]


@functools.lru_cache(maxsize=None)
def host_cpu_flags() -> tuple[str, ...]:
    """Compiler flags for the CPU this process runs on: AVX2 where torch finds AVX2 or better.

    Only JIT builds use them (the module is built for, and cached by, the machine that loads it;
    the flags are part of the cache key). Prebuilt wheels stay portable and use none."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    return tuple(_AVX2_FLAGS) if capability in ("AVX2", "AVX512") else ()


def check(op: str, *, with_cuda: bool, env=os.environ) -> None:
    """Raise OpBuildError with a hint if a tool the build needs is missing."""
    if cxx_compiler(env) is None:
        raise OpBuildError(op, f"no C++ compiler found (looked for '{env.get('CXX', 'c++')}')",
                           hint="install g++ (e.g. `apt-get install g++`) or point CXX at a C++17 compiler.")
    if ninja(env) is None:
        raise OpBuildError(op, "ninja is not installed",
                           hint="`pip install ninja` (torch's extension builder needs it).")
    if not with_cuda:
        return
    import torch

    if torch.version.hip:
        return  # ROCm: torch's builder locates hipcc itself through ROCM_HOME.
    nvcc_path = nvcc(env)
    if nvcc_path is None:
        raise OpBuildError(op, "the CUDA toolkit (nvcc) was not found",
                           hint=f"install the CUDA {torch.version.cuda} toolkit and set CUDA_HOME "
                                "(or put nvcc on PATH).")
    found = nvcc_version(nvcc_path)
    if found and torch.version.cuda and found.split(".")[0] != torch.version.cuda.split(".")[0]:
        raise OpBuildError(op, f"nvcc is CUDA {found} but torch was built with CUDA {torch.version.cuda}",
                           hint=f"install a CUDA {torch.version.cuda.split('.')[0]}.x toolkit and point CUDA_HOME at it, "
                                "or install the torch build for your CUDA.")
