"""Base classes every op builder derives from.

An op is declared by a small subclass (one file in op_builder/ops/) naming its
module, its sources and, rarely, extra flags or a compatibility condition.
Everything else is derived here: the build variables, which sources a build
compiles, the flags, the target archs, and the fingerprint that keys the cache.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path
from typing import ClassVar

from op_builder import paths

# Bump when a change to the builder itself must invalidate every cached build.
BUILDER_FORMAT = 1

# Archs compiled when no GPU is visible and TORCH_CUDA_ARCH_LIST is unset (prebuilds):
# Turing to Blackwell, plus PTX of the newest so later GPUs can JIT it.
DEFAULT_CUDA_ARCHS = "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"

_CXX_FLAGS = ["-O3"]
# torch's headers hide the half/bfloat16 operators from device code by default;
# kernels here do arithmetic on them directly.
_NVCC_FLAGS = [
    "-O3", "--expt-relaxed-constexpr", "--expt-extended-lambda", "-lineinfo",
    "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
]
_HIP_FLAGS = ["-O3", "-U__HIP_NO_HALF_OPERATORS__", "-U__HIP_NO_HALF_CONVERSIONS__"]


class OpBuilder:
    """One compiled op. Subclasses set NAME and CPP_SOURCES (and CUDA_SOURCES for CUDA ops)."""

    NAME: ClassVar[str]
    CPP_SOURCES: ClassVar[list[str]] = []     # relative to csrc/; compiled in every build
    CUDA_SOURCES: ClassVar[list[str]] = []    # compiled only when building for a GPU
    EXTRA_CXX_FLAGS: ClassVar[list[str]] = []
    EXTRA_NVCC_FLAGS: ClassVar[list[str]] = []
    GROUP: ClassVar[str]                      # "CPP" or "CUDA": selects APEX_BUILD_<GROUP>_OPS

    def __init__(self, source_root: Path | None = None):
        self.source_root = Path(source_root) if source_root else paths.csrc_root()

    # ---- declared names -------------------------------------------------------------
    @classmethod
    def build_var(cls) -> str:
        return f"APEX_BUILD_{cls.NAME.upper()}"

    @classmethod
    def group_var(cls) -> str:
        return f"APEX_BUILD_{cls.GROUP}_OPS"

    @classmethod
    def description(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    # ---- compatibility ----------------------------------------------------------------
    def is_compatible(self) -> tuple[bool, str]:
        """(True, "") if this op can work with the installed torch; else (False, why)."""
        return True, ""

    # ---- what a build compiles --------------------------------------------------------
    def wants_gpu_build(self) -> bool:
        """Whether a JIT build on this machine should include the GPU kernels."""
        return False

    def sources(self, with_gpu: bool) -> list[Path]:
        names = self.CPP_SOURCES + (self.CUDA_SOURCES if with_gpu else [])
        return [self.source_root / name for name in names]

    def include_dirs(self) -> list[Path]:
        """The project's header dirs (hashed into the cache key)."""
        return [self.source_root / "include"]

    def compile_include_dirs(self, with_gpu: bool) -> list[str]:
        """Every header dir a build passes to the compiler: the project's, plus (GPU builds) the
        CUDA library headers that may live only in torch's pip wheels. The latter are not hashed:
        the torch/CUDA versions in the key already pin them."""
        from op_builder import toolchain

        return [str(d.resolve()) for d in self.include_dirs()] + (toolchain.cuda_library_header_dirs() if with_gpu else [])

    def cxx_flags(self) -> list[str]:
        from op_builder import toolchain

        return _CXX_FLAGS + toolchain.openmp_flags() + self.EXTRA_CXX_FLAGS

    def nvcc_flags(self) -> list[str]:
        import torch

        return (_HIP_FLAGS if torch.version.hip else _NVCC_FLAGS) + self.EXTRA_NVCC_FLAGS

    def target_archs(self) -> str:
        return ""

    # ---- cache key ----------------------------------------------------------------------
    def fingerprint(self, with_gpu: bool, portable: bool = False) -> dict:
        """Everything a built module depends on; any change means a different cache entry.

        ``portable`` (prebuilt wheels) leaves out the flags for this machine's CPU."""
        import torch

        from op_builder import toolchain

        return {
            "op": self.NAME,
            "builder_format": BUILDER_FORMAT,
            "sources_sha256": self._hash_inputs(),
            "cxx_flags": self.cxx_flags(),
            "cpu_flags": [] if portable else list(toolchain.host_cpu_flags()),
            "nvcc_flags": self.nvcc_flags() if with_gpu else [],
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "hip": torch.version.hip,
            "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
            "python_abi": sysconfig.get_config_var("EXT_SUFFIX") or sys.implementation.cache_tag,
            "gpu": with_gpu,
            "archs": self.target_archs() if with_gpu else "",
        }

    @staticmethod
    def key(fingerprint: dict) -> str:
        return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:20]

    def _hash_inputs(self) -> str:
        """Content hash of all the op's sources (CPU and GPU alike, so a prebuilt GPU
        module and a CPU-only build of the same checkout agree), every file beside
        them, and the shared headers."""
        files: set[Path] = set()
        for source in self.sources(with_gpu=True):
            files.update(p for p in source.parent.rglob("*") if p.is_file())
        for include in self.include_dirs():
            files.update(p for p in include.rglob("*") if p.is_file())
        digest = hashlib.sha256()
        for path in sorted(files):
            digest.update(str(path.relative_to(self.source_root)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
        return digest.hexdigest()


class CppOpBuilder(OpBuilder):
    """An op whose every kernel is C++ (it still serves CUDA tensors through ATen)."""

    GROUP = "CPP"


class CUDAOpBuilder(OpBuilder):
    """An op with CUDA kernels beside its C++ CPU kernels (HIP on ROCm builds of torch)."""

    GROUP = "CUDA"

    def wants_gpu_build(self) -> bool:
        import torch

        return torch.cuda.is_available()

    def target_archs(self) -> str:
        """TORCH_CUDA_ARCH_LIST (PYTORCH_ROCM_ARCH on ROCm) when set, else the visible GPUs', else the default list."""
        import torch

        if torch.version.hip:
            return os.environ.get("PYTORCH_ROCM_ARCH", "")
        configured = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
        if configured and configured != "native":
            return ";".join(configured.replace(" ", ";").split(";")).strip(";")
        if torch.cuda.is_available():
            caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
            return ";".join(f"{major}.{minor}" for major, minor in sorted(caps))
        return DEFAULT_CUDA_ARCHS

    def covers_visible_gpus(self, archs: str) -> bool:
        """Whether a module built for ``archs`` runs on every visible GPU (exact SASS, or PTX it can JIT)."""
        import torch

        if torch.version.hip or not torch.cuda.is_available():
            return True
        built = [a.strip() for a in archs.split(";") if a.strip()]
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            need = major * 10 + minor
            ok = any(_arch_num(a) == need or (a.endswith("+PTX") and _arch_num(a) <= need) for a in built)
            if not ok:
                return False
        return True


def _arch_num(arch: str) -> int:
    major, minor = arch.replace("+PTX", "").split(".")
    return int(major) * 10 + int(minor[0])
