"""The one exception a failed build raises, and how its message is made.

A raw ninja failure ("ninja -v returned non-zero exit status 1") tells the user
nothing. OpBuildError instead names the op, quotes the first real compiler error
lines, the failing command, the full log's path, and a one-line hint when the
cause is a known one.
"""
from __future__ import annotations

import re
from pathlib import Path

# file:line[:col]: [fatal ]error: ...   (gcc, clang)
_GCC_ERROR = re.compile(r"^\S[^:\n]*:\d+(?::\d+)?:\s+(?:fatal\s+)?error\b")
# file(line): [catastrophic ]error ...  (nvcc front end)
_NVCC_ERROR = re.compile(r"^\S.*\(\d+\):\s+(?:catastrophic\s+)?error\b")
# Linker, loader and ninja failures carry no file:line but are just as real.
_LINK_ERROR = re.compile(r"undefined reference to|undefined symbol:|cannot find -l|ld returned|nvcc fatal|ImportError|error: command|^ninja: error:")

# Known causes recognised in a build log, each with the one line that fixes it.
_LOG_HINTS = (
    (re.compile(r"Unsupported gpu architecture|unsupported gpu architecture"),
     "nvcc does not know one of the target archs: set TORCH_CUDA_ARCH_LIST to archs your CUDA toolkit supports (e.g. 9.0)."),
    (re.compile(r"No space left on device"),
     "the disk is full: free space or point APEX_CACHE_DIR at a larger disk."),
    (re.compile(r"(c\+\+|g\+\+|cc1plus|x86_64-linux-gnu-g\+\+).*(not found|No such file)"),
     "no working C++ compiler: install g++ (e.g. `apt-get install g++`) or set CXX."),
    (re.compile(r"nvcc: (not found|No such file)|/bin/nvcc.*No such file"),
     "nvcc not found: install the CUDA toolkit matching torch's CUDA version and set CUDA_HOME."),
    (re.compile(r"killed|Killed signal terminated program"),
     "the compiler was killed, usually for lack of memory: set MAX_JOBS=1 and retry."),
)

_MAX_ERROR_LINES = 12


class OpBuildError(RuntimeError):
    """An apex op could not be built (compiled, linked or loaded)."""

    def __init__(self, op: str, summary: str, *, errors: str = "", command: str = "",
                 log_path: Path | None = None, hint: str = ""):
        self.op, self.summary, self.errors = op, summary, errors
        self.command, self.log_path, self.hint = command, log_path, hint
        parts = [f"apex could not build op '{op}': {summary}"]
        if errors:
            parts.append("first compiler errors:\n" + _indent(errors))
        if command:
            parts.append("failing command:\n" + _indent(command))
        if log_path:
            parts.append(f"full build log: {log_path}")
        if hint:
            parts.append(f"hint: {hint}")
        super().__init__("\n".join(parts))


class OpNotCompatibleError(ImportError):
    """The op cannot work with this torch/toolchain at all (the reason says why)."""


class UnsafeCacheDirError(PermissionError):
    """The JIT cache directory could be written by someone else, so loading from it is refused."""


def first_error_lines(log: str) -> str:
    """The first real error lines of a build log, with the lines that follow each
    (compilers put the offending source line and caret there)."""
    lines = log.splitlines()
    picked: list[str] = []
    for i, line in enumerate(lines):
        if _GCC_ERROR.match(line) or _NVCC_ERROR.match(line) or _LINK_ERROR.search(line):
            picked.extend(lines[i:i + 3])
            if len(picked) >= _MAX_ERROR_LINES:
                break
    return "\n".join(dict.fromkeys(picked))  # drop repeated context lines, keep order


def failing_command(log: str) -> str:
    """The command ninja reports after 'FAILED:' (ninja -v prints it on the next line)."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("FAILED:") and i + 1 < len(lines):
            return lines[i + 1].strip()
    return ""


def build_error_from_log(op: str, log: str, log_path: Path) -> OpBuildError:
    """The OpBuildError for a failed build whose whole output is ``log`` (saved at ``log_path``)."""
    if "FAILED:" in log:
        summary = "compilation failed"
    elif re.search(r"ImportError|OSError: .*\.so", log):
        summary = "the library compiled but does not load"
    else:  # no compiler ran into an error: the build child's own last words name the cause
        summary = "the build failed: " + (last_line(log) or "no output")
    return OpBuildError(op, summary, errors=first_error_lines(log), command=failing_command(log),
                        log_path=log_path, hint=hint_for_log(log))


def last_line(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def hint_for_log(log: str) -> str:
    for pattern, hint in _LOG_HINTS:
        if pattern.search(log):
            return hint
    return ""


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
