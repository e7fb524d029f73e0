"""What the machine has for compiling ops: C++ compiler, ninja, the CUDA toolkit (nvcc).

Checked before a build starts, so a missing tool gives a one-line hint instead of a compiler
log. Tools are found where torch's own extension builder would find them, and a little further
(ninja installed into the venv without the venv being activated). Nothing here imports torch at
module import time.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .errors import OpBuildError

# Where torch's extension builder looks when neither CUDA_HOME/CUDA_PATH nor nvcc on PATH says.
DEFAULT_CUDA_HOME = Path("/usr/local/cuda")


def cxx_compiler(env=os.environ) -> Optional[str]:
    """Path of the C++ compiler torch's extension builder will call ($CXX or c++)."""
    return shutil.which(env.get("CXX", "c++"), path=env.get("PATH"))


def ninja(env=os.environ) -> Optional[str]:
    """ninja on PATH, else beside this Python (a venv used without activating it), else the
    `ninja` package's own copy."""
    found = shutil.which("ninja", path=env.get("PATH"))
    if found:
        return found
    beside_python = Path(sys.executable).parent / "ninja"
    if os.access(beside_python, os.X_OK):
        return str(beside_python)
    try:
        import ninja as ninja_package
    except ImportError:
        return None
    packaged = Path(getattr(ninja_package, "BIN_DIR", "")) / "ninja"
    return str(packaged) if os.access(packaged, os.X_OK) else None


def build_path(env=os.environ) -> str:
    """PATH for a build: torch's extension builder runs plain `ninja`, so its folder goes first
    when ninja was found off PATH."""
    path = env.get("PATH", os.defpath)
    found = ninja(env)
    if found and shutil.which("ninja", path=path) != found:
        path = os.pathsep.join([str(Path(found).parent), path])
    return path


@dataclass(frozen=True)
class CudaToolkit:
    """A CUDA toolkit candidate: its root, where that came from, and its nvcc (None: none there)."""

    home: Path
    origin: str  # "CUDA_HOME", "CUDA_PATH", "nvcc on PATH" or str(DEFAULT_CUDA_HOME)
    nvcc: Optional[str]


def cuda_toolkit(env=os.environ) -> Optional[CudaToolkit]:
    """The toolkit torch's builder would use: $CUDA_HOME, $CUDA_PATH, the nvcc on PATH, /usr/local/cuda.

    nvcc on PATH is asked (not just located) because it is often a wrapper script or a symlink
    outside the toolkit (/usr/local/bin/nvcc), whose parent has no lib64/.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            return _toolkit(Path(env[var]), var)
    nvcc_on_path = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc_on_path:
        return _toolkit(_toolkit_root(nvcc_on_path), "nvcc on PATH")
    if DEFAULT_CUDA_HOME.is_dir():
        return _toolkit(DEFAULT_CUDA_HOME, str(DEFAULT_CUDA_HOME))
    return None


def _toolkit(home: Path, origin: str) -> CudaToolkit:
    nvcc_path = home / "bin" / "nvcc"
    return CudaToolkit(home, origin, str(nvcc_path) if os.access(nvcc_path, os.X_OK) else None)


def cuda_home(env=os.environ) -> Optional[Path]:
    toolkit = cuda_toolkit(env)
    return toolkit.home if toolkit and toolkit.nvcc else None


def nvcc(env=os.environ) -> Optional[str]:
    toolkit = cuda_toolkit(env)
    return toolkit.nvcc if toolkit else None


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


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc_path: str) -> Optional[str]:
    """'13.0' from `nvcc --version`, or None if it cannot be run."""
    try:
        out = subprocess.run([nvcc_path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def cuda_library_header_dirs(env=os.environ) -> list[str]:
    """Header dirs of CUDA libraries installed as pip wheels beside torch (nvidia/*/include).

    torch's headers include cuSPARSE/cuBLAS headers that a bare nvcc install (no full toolkit)
    lacks; the wheels torch depends on carry them. Empty when the toolkit has them itself.
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


# x86-64 flags (and the macros that make ATen's at::vec::Vectorized use its AVX2 code) for the
# C++ CPU kernels, as torch builds its own AVX2 kernels. Without them Vectorized is ATen's generic
# scalar fallback: amp_C's CPU AdamW ran 10x slower (47 vs 4.7 ms for 4.2M params,
# benchmarks/optimizers/bench_cpu_adam.py).
_AVX2_FLAGS = ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2"]


@functools.lru_cache(maxsize=None)
def host_cpu_flags() -> tuple[str, ...]:
    """Compiler flags for the CPU this process runs on: AVX2 where torch finds AVX2 or better.

    Only JIT builds use them (the library is built for, and cached by, the machine that loads
    it; the flags are part of the cache key). Prebuilt wheels stay portable and use none."""
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
                           hint=f"`{sys.executable} -m pip install ninja` (torch's extension builder needs it).")
    if with_cuda:
        _check_cuda(op, env)


def _check_cuda(op: str, env) -> None:
    import torch

    if torch.version.hip:
        return  # ROCm: torch's builder locates hipcc itself through ROCM_HOME.
    if not torch.version.cuda:
        raise OpBuildError(op, f"this torch ({torch.__version__}) is a CPU-only build, which cannot compile "
                               "CUDA kernels", hint="install a CUDA build of torch to build the GPU kernels; "
                                                    "the CPU kernels build without one.")
    major = torch.version.cuda.split(".")[0]
    toolkit = cuda_toolkit(env)
    if toolkit is None:
        raise OpBuildError(op, "the CUDA toolkit (nvcc) was not found: CUDA_HOME and CUDA_PATH are unset, "
                               f"no nvcc is on PATH and there is no {DEFAULT_CUDA_HOME}",
                           hint=f"install a CUDA {major}.x toolkit and set CUDA_HOME (or put nvcc on PATH).")
    if toolkit.nvcc is None:
        where = f"{toolkit.origin}={toolkit.home}" if toolkit.origin.startswith("CUDA_") else str(toolkit.home)
        raise OpBuildError(op, f"{where} has no bin/nvcc",
                           hint=f"point CUDA_HOME at a CUDA {major}.x toolkit (the folder holding bin/nvcc).")
    found = nvcc_version(toolkit.nvcc)
    if found and found.split(".")[0] != major:
        raise OpBuildError(op, f"nvcc is CUDA {found} ({toolkit.nvcc}) but torch was built with CUDA {torch.version.cuda}",
                           hint=f"install a CUDA {major}.x toolkit and point CUDA_HOME at it, "
                                "or install the torch build for your CUDA.")
