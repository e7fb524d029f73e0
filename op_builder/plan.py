"""One build of one op, decided once: the BuildPlan that JIT loads, prebuilds and compile checks share.

Whether a build includes the GPU kernels, which sources it compiles, every compiler flag, the
target archs and the cache key are all settled here from the op's builder and the purpose of
the build; the code that runs a build only carries the plan out.
"""
from __future__ import annotations

import enum
import hashlib
import json
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from . import archs, toolchain
from .builder import CXX_FLAGS, HIP_FLAGS, NVCC_FLAGS, OpBuilder

# Bump when a change to the builder itself must invalidate every cached build.
BUILDER_FORMAT = 2

# GPU builds define this in C++ and CUDA code alike: an op's .cpp files register their CUDA
# kernels only under it, so a CPU-only build never references symbols it did not compile.
WITH_CUDA_DEFINE = "-DAPEX_WITH_CUDA"

# A compile check (--fast) asks "does it compile?", not "how fast does it run?": host code at -O0,
# device code to PTX only (no ptxas, see archs.ptx_only_flags) with NVVM's optimiser off. Measured
# here on fused_swiglu_cuda.cu for sm_90: 7.5 s of CPU full, 4.1 s fast (cicc 6.4 -> 3.3 s, ptxas
# 6.1 s -> none); cudafe++ and the host compile of the stub stay.
_FAST_HOST_FLAGS = ["-O0"]
_FAST_DEVICE_FLAGS = ["-O0", "-Xcicc", "-O0"]


class Purpose(enum.Enum):
    JIT = "jit"            # loaded here: GPU kernels iff a GPU is visible, tuned for this CPU
    PREBUILD = "prebuild"  # into a wheel: GPU kernels of every CUDA op, portable CPU code
    CHECK = "check"        # compile check (no cache): GPU kernels of every CUDA op


@dataclass(frozen=True)
class BuildPlan:
    """Everything one build needs; ``fingerprint`` is what the result depends on, ``key`` its hash."""

    op: str
    purpose: Purpose
    with_gpu: bool
    sources: tuple[Path, ...]
    include_dirs: tuple[str, ...]
    cxx_flags: tuple[str, ...]
    nvcc_flags: tuple[str, ...]
    archs: str
    fingerprint: dict
    key: str

    @property
    def library_file(self) -> str:
        """The file name a build produces (torch's extension builder names it after the op)."""
        return f"{self.op}.so"

    def target(self) -> str:
        return f"GPU archs {self.archs}" if self.with_gpu else "CPU only"

    def child_spec(self, build_dir: Path, sources: list[Path] | None = None) -> dict:
        """What the build child (_build_child.py) needs, as JSON-ready values; ``sources`` as it is to
        compile them (unity.group_sources), the plan's own by default."""
        sources = list(self.sources) if sources is None else sources
        return {"name": self.op, "sources": [str(s) for s in sources], "include_dirs": list(self.include_dirs),
                "cxx_flags": list(self.cxx_flags), "nvcc_flags": list(self.nvcc_flags), "with_gpu": self.with_gpu,
                "build_dir": str(build_dir)}


def plan_build(builder: OpBuilder, purpose: Purpose, *, fast: bool = False) -> BuildPlan:
    """The build of ``builder``'s op for ``purpose``. ``fast`` (checks only) skips device code
    generation and optimisation: it tells whether the sources compile, not how fast they run."""
    import torch

    with_gpu = builder.has_gpu_kernels() and (torch.cuda.is_available() if purpose is Purpose.JIT else True)
    target_archs = archs.target_archs(for_this_machine=purpose is Purpose.JIT) if with_gpu else ""
    base_cxx = [*CXX_FLAGS, *toolchain.openmp_flags(), *builder.EXTRA_CXX_FLAGS]
    base_nvcc = [*(HIP_FLAGS if torch.version.hip else NVCC_FLAGS), *builder.EXTRA_NVCC_FLAGS] if with_gpu else []
    cpu_flags = list(toolchain.host_cpu_flags()) if purpose is Purpose.JIT else []
    fingerprint = {
        "op": builder.NAME,
        "builder_format": BUILDER_FORMAT,
        "sources_sha256": _hash_files(builder.input_files(), builder.source_root),
        "cxx_flags": base_cxx,
        "cpu_flags": cpu_flags,
        "nvcc_flags": base_nvcc,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "python_abi": sysconfig.get_config_var("EXT_SUFFIX") or sys.implementation.cache_tag,
        "gpu": with_gpu,
        "archs": target_archs,
    }
    gpu_define = [WITH_CUDA_DEFINE] if with_gpu else []
    nvcc = [*base_nvcc, *gpu_define]
    if fast and with_gpu and not torch.version.hip:  # (hipcc: the full build)
        nvcc = [f for f in nvcc if f not in ("-O3", "-lineinfo")] + _FAST_DEVICE_FLAGS + archs.ptx_only_flags(target_archs)
    cxx = [*base_cxx, *cpu_flags, *gpu_define]
    if fast:
        cxx = [f for f in cxx if f != "-O3"] + _FAST_HOST_FLAGS
    include_dirs = [str(d.resolve()) for d in builder.include_dirs()]
    if with_gpu:
        include_dirs += toolchain.cuda_library_header_dirs()
    return BuildPlan(op=builder.NAME, purpose=purpose, with_gpu=with_gpu, sources=tuple(builder.sources(with_gpu)),
                     include_dirs=tuple(include_dirs), cxx_flags=tuple(cxx), nvcc_flags=tuple(nvcc), archs=target_archs,
                     fingerprint=fingerprint, key=fingerprint_key(fingerprint))


def fingerprint_key(fingerprint: dict) -> str:
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:20]


def _hash_files(files: list[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for path in files:
        try:
            name = str(path.relative_to(root))
        except ValueError:
            name = str(path)
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()
