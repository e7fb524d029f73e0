"""What an op declares: one small subclass per file in ops/.

An op is its library's NAME and a folder of sources under csrc/ (SOURCE_DIR, default NAME): by
convention every ``*.cpp`` there is compiled in every build and every ``*.cu`` in GPU builds, so
adding a file never edits the builder. Rarely an op adds flags, shared source folders or a
compatibility condition. How a build turns this into compiler arguments and a cache key is
plan.py's job.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Optional

from . import paths

# The build flags every op gets; ops add theirs with EXTRA_CXX_FLAGS / EXTRA_NVCC_FLAGS.
CXX_FLAGS = ["-O3"]
# torch's headers hide the half/bfloat16 operators from device code by default;
# kernels here do arithmetic on them directly.
NVCC_FLAGS = [
    "-O3", "--expt-relaxed-constexpr", "--expt-extended-lambda", "-lineinfo",
    "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
]
HIP_FLAGS = ["-O3", "-U__HIP_NO_HALF_OPERATORS__", "-U__HIP_NO_HALF_CONVERSIONS__"]


class OpBuilder:
    """One op library. Subclasses set NAME and derive from CppOpBuilder or CUDAOpBuilder."""

    NAME: ClassVar[str]
    GROUP: ClassVar[str]                               # "CPP" or "CUDA": APEX_BUILD_<GROUP>_OPS
    SOURCE_DIR: ClassVar[Optional[str]] = None         # folder under csrc/; None means NAME
    EXTRA_SOURCE_DIRS: ClassVar[list[str]] = []        # more folders (shared sources) built into this op
    CPP_SOURCES: ClassVar[Optional[list[str]]] = None  # explicit files relative to csrc/, instead of
    CUDA_SOURCES: ClassVar[Optional[list[str]]] = None  # the convention (rarely needed)
    EXTRA_CXX_FLAGS: ClassVar[list[str]] = []
    EXTRA_NVCC_FLAGS: ClassVar[list[str]] = []
    # Read by apex's Python face of the op (apex/_faces.py): the dispatcher name prefix of the
    # historical module's functions (None: NAME + "_") and a module of hand-written face functions.
    FACE_PREFIX: ClassVar[Optional[str]] = None
    FACE_MODULE: ClassVar[Optional[str]] = None

    def __init__(self, source_root: Optional[Path] = None):
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
        """The first line of the class docstring (the README's op table shows it)."""
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    @classmethod
    def has_gpu_kernels(cls) -> bool:
        return cls.GROUP == "CUDA"

    # ---- compatibility and hooks ------------------------------------------------------
    def is_compatible(self) -> tuple[bool, str]:
        """(True, "") if this op can work with the installed torch; else (False, why)."""
        return True, ""

    def after_load(self) -> None:
        """Called once the library is loaded in this process: register Python-side pieces here."""

    # ---- what a build compiles --------------------------------------------------------
    def source_dirs(self) -> list[Path]:
        """The folders whose sources this op compiles (all hashed into its cache key)."""
        return [self.source_root / name for name in [self.SOURCE_DIR or self.NAME, *self.EXTRA_SOURCE_DIRS]]

    def sources(self, with_gpu: bool) -> list[Path]:
        cpp = self._declared_or_found(self.CPP_SOURCES, "*.cpp")
        cuda = self._declared_or_found(self.CUDA_SOURCES, "*.cu") if with_gpu and self.has_gpu_kernels() else []
        return cpp + cuda

    def include_dirs(self) -> list[Path]:
        """The project's header dirs (hashed into the cache key)."""
        return [self.source_root / "include"]

    def input_files(self) -> list[Path]:
        """Every project file a build of this op may read: all files of its source folders (and of
        the folders of explicitly listed sources) and of the shared header dirs. CPU and GPU builds
        hash the same set, so a prebuilt GPU library and a CPU-only build of one checkout agree."""
        folders = {*self.source_dirs(), *(s.parent for s in self.sources(with_gpu=True)), *self.include_dirs()}
        return sorted({p for folder in folders if folder.is_dir() for p in folder.rglob("*") if p.is_file()})

    def _declared_or_found(self, declared: Optional[list[str]], pattern: str) -> list[Path]:
        if declared is not None:
            return [self.source_root / name for name in declared]
        return [path for folder in self.source_dirs() for path in sorted(folder.glob(pattern))]


class CppOpBuilder(OpBuilder):
    """An op whose every kernel is C++ (it still serves CUDA tensors through ATen)."""

    GROUP = "CPP"


class CUDAOpBuilder(OpBuilder):
    """An op with CUDA kernels beside its C++ CPU kernels (HIP on ROCm builds of torch)."""

    GROUP = "CUDA"
