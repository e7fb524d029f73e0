"""Prebuilding ops into the wheel: APEX_BUILD_<NAME>=1, APEX_BUILD_CUDA_OPS=1, APEX_BUILD_CPP_OPS=1.

Used by setup.py. Without any of those variables nothing here imports torch, so
a plain `pip install .` copies Python files and is done. An op that cannot be
built here (incompatible, no nvcc) is skipped with its reason; it will compile on
first use instead, so the install never fails for it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from op_builder.builder import DEFAULT_CUDA_ARCHS, OpBuilder
from op_builder.errors import OpBuildError
from op_builder.registry import all_builders
from op_builder import toolchain

PREBUILT_PACKAGE = "op_builder._prebuilt"


def _enabled(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def requested(env=os.environ) -> list[type[OpBuilder]]:
    """Builder classes whose own variable or group variable asks for a prebuild."""
    return [cls for cls in all_builders().values()
            if _enabled(env.get(cls.build_var())) or _enabled(env.get(cls.group_var()))]


def extensions(source_root: Path) -> tuple[list, dict]:
    """(ext_modules, cmdclass) for setup(): one extension per requested, buildable op."""
    chosen = requested()
    if not chosen:
        return [], {}
    home = toolchain.cuda_home()
    if home and "CUDA_HOME" not in os.environ:  # torch's extension builder reads it once, at import
        os.environ["CUDA_HOME"] = str(home)
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    if not torch.version.hip and not torch.cuda.is_available():
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_CUDA_ARCHS)
    ext_modules, fingerprints = [], {}
    for cls in chosen:
        builder = cls(source_root=source_root)
        with_gpu = cls.GROUP == "CUDA"
        reason = _cannot_build(builder, with_gpu)
        if reason:
            print(f"apex: not prebuilding '{cls.NAME}': {reason}; it will compile on first use instead")
            continue
        make = CUDAExtension if with_gpu else CppExtension
        ext_modules.append(make(
            name=f"{PREBUILT_PACKAGE}.{cls.NAME}",
            sources=[str(s) for s in builder.sources(with_gpu)],
            include_dirs=builder.compile_include_dirs(with_gpu),
            extra_compile_args={"cxx": builder.cxx_flags(), "nvcc": builder.nvcc_flags() if with_gpu else []},
        ))
        fingerprints[cls.NAME] = builder.fingerprint(with_gpu, portable=True)
        print(f"apex: prebuilding '{cls.NAME}'" + (f" for archs {fingerprints[cls.NAME]['archs']}" if with_gpu else ""))

    class BuildExtensionWithManifest(BuildExtension):
        """Writes <NAME>.json beside each prebuilt module: the loader uses the module only if it matches."""

        def build_extension(self, ext):
            super().build_extension(ext)
            name = ext.name.rsplit(".", 1)[1]
            built = Path(self.get_ext_fullpath(ext.name))
            manifest = {"file": built.name, "fingerprint": fingerprints[name]}
            (built.parent / f"{name}.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))

    return ext_modules, {"build_ext": BuildExtensionWithManifest.with_options(use_ninja=True)}


def _cannot_build(builder: OpBuilder, with_gpu: bool) -> str:
    compatible, reason = builder.is_compatible()
    if not compatible:
        return reason
    try:
        toolchain.check(builder.NAME, with_cuda=with_gpu)
    except OpBuildError as error:
        return f"{error.summary} ({error.hint})"
    return ""
