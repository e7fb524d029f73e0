"""A precompiled header (GCC's .gch) of the torch headers that every op's registration unit parses.

The slowest unit of an op's build is the one that registers its ops: it includes apex/op.h or
apex/autograd.h, whose torch headers (the dispatcher, torch/library.h, autograd's graph nodes) take
most of its 10-20 s. Parsed once into a .gch, they load in about a second. This module says what
the header holds, what its .gch depends on (its key), which units of a build use it and how. Where a
.gch comes from (the JIT cache, or a temporary one for a compile check or a prebuild) is
precompiled_cache.py's job.

What it holds: the torch and standard headers that apex/autograd.h includes, directly or through
apex's other headers (apex/op.h among them), outside any #if. apex's own headers stay out, so
editing them never rebuilds the .gch, and so the .gch does not depend on APEX_WITH_CUDA (which they
test): one serves C++-only and CUDA ops alike. Torch's Python bindings are not among them (only
<Python.h>): a .gch saves their parse, not the ~5 s of code GCC generates from pybind11 in each unit
that includes them, so they live in one unit that every op links (python_entry.py).

Which units use it: those that include apex/op.h, directly or not (every registration unit, or the
unity unit holding one). Each is compiled through a generated file in the build directory that
includes the header, then the source by its absolute path (compiler messages name the real file and
line). Sources must not define macros that change torch's headers before including them (unity
units assume the same). A unit that includes apex/op.h but not apex/autograd.h gets autograd's torch
headers too, at no measurable cost (optimizer_ops.cpp compiled faster with them than with op.h's
alone); a source that uses autograd must still include apex/autograd.h itself, or it would build
here and fail with APEX_PCH=0 or another compiler.

Whether GCC uses it: only if the compiler, the code-generation flags and the macros it saw are the
same. Otherwise GCC says why (-Winvalid-pch, in the build log) and parses the header's text instead:
slower, same library. TORCH_EXTENSION_NAME, which differs per op, is left out of the .gch's build: GCC
accepts macros defined later that the header never uses. A .gch that cannot be read is a fatal GCC
error, not a fallback: its integrity is checked before use, and a build that fails on it anyway is
built again without it (compiler.py).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import toolchain
from .plan import WITH_CUDA_DEFINE, BuildPlan

PCH_ENV = "APEX_PCH"
# The torch and standard headers this header includes (through apex's other headers too) are precompiled...
CONTENT_HEADER = "apex/autograd.h"
# ...for every unit that includes this one, directly or not (apex/autograd.h does).
USER_HEADER = "apex/op.h"
HEADER_FILE = "apex_torch_headers.h"  # the header's text, written beside its .gch
GCH_FILE = HEADER_FILE + ".gch"       # the name GCC looks for when a unit includes HEADER_FILE
# Bump when a change here must invalidate every precompiled header.
HEADER_FORMAT = 1
# Defines that only choose among an op's own sources; torch's headers never test them (GCC would
# refuse the .gch if they did, which a test checks for the real headers).
_OP_ONLY_DEFINES = frozenset({WITH_CUDA_DEFINE})

_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
_OPENS_BLOCK = re.compile(r"^\s*#\s*if")
_CLOSES_BLOCK = re.compile(r"^\s*#\s*endif")
_GUARD = re.compile(r"^\s*#\s*(ifndef|define)\s+(\w+)")
# GCC's -Winvalid-pch: the .gch was found and not used, and why.
_REJECTED = re.compile(r"warning: \S+\.gch: (.*?)\s*\[-Winvalid-pch\]")
# A .gch GCC could not read at all, or a header it then could not find: the build failed because of the PCH.
_BROKE_BUILD = re.compile(r"(?:fatal )?error: .*(?:PCH file|precompiled header|" + re.escape(HEADER_FILE) + ")", re.I)


def setting(env=os.environ) -> str:
    """"on", "off" or "auto" (the default: JIT builds, and compile checks or prebuilds of more than one op)."""
    value = env.get(PCH_ENV, "").strip().lower()
    if value in ("", "auto"):
        return "auto"
    if value in ("0", "off", "no", "false"):
        return "off"
    if value in ("1", "on", "yes", "true"):
        return "on"
    raise ValueError(f"{PCH_ENV}={env[PCH_ENV]!r}: use 1 (always precompile torch's headers), 0 (never) or auto")


@dataclass(frozen=True)
class HeaderPlan:
    """One precompiled header: its text, the flags it is built with, what it depends on, and its key."""

    text: str
    cxx_flags: tuple[str, ...]
    users_include: Path  # USER_HEADER as a build finds it: units that include it use the header
    fingerprint: dict
    key: str


def toolchain_fingerprint(plan: BuildPlan, identity: str, flags: tuple[str, ...]) -> dict:
    """What an artifact shared by every op's build (the .gch, the typed entry's object) depends on
    besides its own text: the compile flags, the compiler, torch's headers and the flags torch's
    extension builder adds (include dirs, -std, ABI), and Python's headers."""
    import torch

    return {
        "cxx_flags": list(flags),
        "compiler": identity,
        "torch": plan.fingerprint["torch"],
        "torch_dir": str(Path(torch.__file__).resolve().parent),
        "cuda": plan.fingerprint["cuda"],
        "cxx11_abi": plan.fingerprint["cxx11_abi"],
        "python_abi": plan.fingerprint["python_abi"],
        "python_include": sysconfig.get_path("include", scheme="posix_prefix"),
    }


def plan_header(plan: BuildPlan) -> Optional[HeaderPlan]:
    """The precompiled header ``plan``'s units can use, or None where there is none: turned off,
    a compiler other than GCC, ROCm (hipcc compiles .cpp files too), or no apex headers to take it from."""
    if setting() == "off" or plan.fingerprint.get("hip") or not sys.platform.startswith("linux"):
        return None
    compiler = toolchain.cxx_compiler()
    identity = gcc_identity(compiler) if compiler else None
    include_dirs = [Path(d) for d in plan.include_dirs]
    content, users_include = (_resolve(name, None, include_dirs) for name in (CONTENT_HEADER, USER_HEADER))
    if identity is None or content is None or users_include is None:
        return None
    includes = precompilable_includes(content, include_dirs)
    if not includes:
        return None
    text = (f"// Generated by apex.op_builder.precompiled_header: the torch and standard headers of {CONTENT_HEADER}.\n"
            + "".join(f"#include <{name}>\n" for name in includes))
    flags = tuple(flag for flag in plan.cxx_flags if flag not in _OP_ONLY_DEFINES)
    fingerprint = {"header_format": HEADER_FORMAT, "header": text, **toolchain_fingerprint(plan, identity, flags)}
    key = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:20]
    return HeaderPlan(text=text, cxx_flags=flags, users_include=users_include, fingerprint=fingerprint, key=key)


@functools.lru_cache(maxsize=None)
def gcc_identity(compiler: str) -> Optional[dict]:
    """Which GCC ``compiler`` is (its path, version, and the size and time of it and of its C++ front
    end: GCC refuses a .gch made by another binary), or None if it is not GCC."""
    env = dict(os.environ, LC_ALL="C")
    try:
        described = subprocess.run([compiler, "-v"], capture_output=True, text=True, timeout=60, env=env)
        front_end = subprocess.run([compiler, "-print-prog-name=cc1plus"], capture_output=True, text=True,
                                   timeout=60, env=env).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    version = re.search(r"^gcc version .*$", described.stdout + described.stderr, re.M)
    if version is None or "clang" in (described.stdout + described.stderr).lower():
        return None
    binaries = {}
    for binary in (compiler, front_end):
        try:
            info = Path(binary).resolve().stat()
        except OSError:
            continue
        binaries[str(Path(binary).resolve())] = [info.st_size, info.st_mtime_ns]
    return {"version": version.group(0), "binaries": binaries}


def precompilable_includes(root: Path, include_dirs: list[Path]) -> list[str]:
    """The headers outside ``include_dirs`` that ``root`` includes, directly or through headers inside
    them, outside any #if: torch's and the standard library's, in the order they are first met."""
    found: list[str] = []
    seen = {root}
    pending = [root]
    while pending:
        header = pending.pop(0)
        for kind, name in _top_level_includes(header):
            ours = _resolve(name, header.parent if kind == '"' else None, include_dirs)
            if ours is None:
                if kind == "<" and name not in found:  # (a quoted one not found here is left alone)
                    found.append(name)
            elif ours not in seen:
                seen.add(ours)
                pending.append(ours)
    return found


def units_using(header: HeaderPlan, sources: list[Path], include_dirs: list[Path]) -> list[Path]:
    """The C++ units of ``sources`` that include USER_HEADER (directly or not) and include something
    before any other directive, so that including the header first changes nothing they define."""
    return [source for source in sources if source.suffix == ".cpp" and _opens_with_include(source)
            and _reaches(source, header.users_include, include_dirs)]


def use_in(header: HeaderPlan, gch: Path, sources: list[Path], build_dir: Path,
           include_dirs: list[Path]) -> list[Path]:
    """``sources`` as a build compiles them with ``gch``: the header's text and a link to the .gch in
    ``build_dir``, and each unit that uses it replaced by a generated file there of the same name
    that includes the header, then the unit (the generated unity units get the line in place)."""
    text_header = build_dir / HEADER_FILE
    text_header.write_text(header.text)  # what GCC parses if it refuses the .gch, or if it is gone
    (build_dir / GCH_FILE).unlink(missing_ok=True)
    (build_dir / GCH_FILE).symlink_to(gch)
    first_line = f'#include "{text_header}"  // precompiled: {GCH_FILE}\n'
    users = set(units_using(header, sources, include_dirs))
    compiled = []
    for source in sources:
        if source not in users:
            compiled.append(source)
        elif source.parent == build_dir:  # a unity unit, generated for this build
            source.write_text(first_line + source.read_text())
            compiled.append(source)
        else:
            wrapper = build_dir / source.name
            wrapper.write_text(first_line + f'#include "{source.resolve()}"\n')
            compiled.append(wrapper)
    return compiled


def unlink(build_dir: Path) -> None:
    """Remove the link to the .gch that use_in made in ``build_dir`` (once the build is over)."""
    (build_dir / GCH_FILE).unlink(missing_ok=True)


def rejection(log: str) -> Optional[str]:
    """Why GCC did not use the .gch in a build whose output is ``log`` (None: it did, or there was none)."""
    match = _REJECTED.search(log)
    return match.group(1) if match else None


def broke_build(log: str) -> Optional[str]:
    """The error line of a build that failed because of the precompiled header, else None."""
    match = _BROKE_BUILD.search(log)
    return match.group(0) if match else None


# ---- reading includes --------------------------------------------------------------------
def _top_level_includes(path: Path) -> list[tuple[str, str]]:
    """(kind, name) of each #include of ``path`` outside #if blocks (an include guard does not count)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    depth, includes, guard = 0, [], _include_guard(lines)
    for line in lines:
        if _OPENS_BLOCK.match(line):
            depth += 1
        elif _CLOSES_BLOCK.match(line):
            depth = max(depth - 1, 0)
        elif depth <= guard:
            match = _INCLUDE.match(line)
            if match:
                includes.append((match.group(1), match.group(2)))
    return includes


def _include_guard(lines: list[str]) -> int:
    """1 if the file is wrapped in an include guard (#ifndef X / #define X first), else 0."""
    directives = [line for line in lines if line.lstrip().startswith("#")][:2]
    matches = [_GUARD.match(line) for line in directives]
    if len(matches) == 2 and all(matches) and matches[0].group(1) == "ifndef" and matches[1].group(1) == "define" \
            and matches[0].group(2) == matches[1].group(2):
        return 1
    return 0


def _resolve(name: str, including_dir: Optional[Path], include_dirs: list[Path]) -> Optional[Path]:
    """The file an #include of ``name`` names, looked for beside the including file (quoted
    includes) and in ``include_dirs``; None for headers found elsewhere (torch's, the system's)."""
    candidates = [Path(name)] if os.path.isabs(name) else \
        [folder / name for folder in ([including_dir] if including_dir else []) + include_dirs]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    return None


def _reaches(source: Path, target: Path, include_dirs: list[Path]) -> bool:
    seen, pending = {source.resolve()}, [source.resolve()]
    while pending:
        current = pending.pop()
        for kind, name in _top_level_includes(current):
            found = _resolve(name, current.parent if kind == '"' else None, include_dirs)
            if found == target:
                return True
            if found is not None and found not in seen:
                seen.add(found)
                pending.append(found)
    return False


def _opens_with_include(path: Path) -> bool:
    """Whether the first directive of ``path`` (past comments and #pragma once) is an #include;
    for a generated unity unit, of its first source too."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return False
    in_comment = False
    for line in (line.strip() for line in lines):
        if in_comment:
            in_comment = "*/" not in line
            continue
        if not line or line.startswith("//") or re.match(r"#\s*pragma\s+once", line):
            continue
        if line.startswith("/*"):
            in_comment = "*/" not in line
            continue
        match = _INCLUDE.match(line)
        if match is None:
            return False
        first = Path(match.group(2))
        return not (first.is_absolute() and first.suffix == ".cpp") or _opens_with_include(first)
    return False
