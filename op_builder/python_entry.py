"""The one unit of an op library that includes torch's Python bindings, compiled once and linked into all.

apex/op.h's typed Python entry calls torch's bindings (tensors to and from Python objects, C++ errors
and warnings to Python's) through a few non-template functions, apex/python_entry.h, defined in
SOURCE. Its headers pull in pybind11, whose code GCC generates at -O3 wherever they are included
(~125 KB of .text, 4.5-6 s a unit on a 2-core machine): once, here, instead of in every registration
unit. The object depends only on its two files, torch, the compiler and the C++ flags (the key); it
is built like the precompiled header (precompiled_cache.py: the JIT cache, or one run's temporary
folder), whether or not that header is on, and linked into each op library, where its functions are
hidden. Where no object can be had (another compiler than GCC, ROCm, a build without a shared
provider, an object that failed to build), SOURCE is compiled as one of the op's own units instead.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import toolchain
from .plan import WITH_CUDA_DEFINE, BuildPlan
from .precompiled_header import gcc_identity, toolchain_fingerprint

SOURCE = "apex/python_entry.cpp"  # under the op's include dirs, beside its header
HEADER = "apex/python_entry.h"
OBJECT_FILE = "apex_python_entry.o"
# Bump when a change here must invalidate every cached object.
OBJECT_FORMAT = 1


@dataclass(frozen=True)
class ObjectPlan:
    """SOURCE's build: the source, its flags and include dirs, what it depends on, and its key."""

    source: Path
    cxx_flags: tuple[str, ...]
    include_dirs: tuple[str, ...]
    fingerprint: dict
    key: str


def find_source(plan: BuildPlan) -> Optional[Path]:
    """SOURCE as ``plan``'s build finds it (None: these sources have no typed entry to link)."""
    for folder in plan.include_dirs:
        candidate = Path(folder) / SOURCE
        if candidate.is_file():
            return candidate.resolve()
    return None


def plan_object(plan: BuildPlan) -> Optional[ObjectPlan]:
    """The shared object ``plan`` can link, or None where there is none: no SOURCE, a compiler other
    than GCC (its identity is the key's), ROCm (hipcc compiles .cpp files too), not Linux."""
    source = find_source(plan)
    if source is None or plan.fingerprint.get("hip") or not sys.platform.startswith("linux"):
        return None
    compiler = toolchain.cxx_compiler()
    identity = gcc_identity(compiler) if compiler else None
    if identity is None:
        return None
    include_dir = str(source.parent.parent)
    flags = tuple(flag for flag in plan.cxx_flags if flag != WITH_CUDA_DEFINE)  # the source never tests it
    fingerprint = {
        "object_format": OBJECT_FORMAT,
        "sources": {name: (source.parent.parent / name).read_text() for name in (SOURCE, HEADER)},
        **toolchain_fingerprint(plan, identity, flags),
    }
    key = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:20]
    return ObjectPlan(source=source, cxx_flags=flags, include_dirs=(include_dir,), fingerprint=fingerprint, key=key)
