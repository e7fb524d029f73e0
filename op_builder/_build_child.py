"""One op build, in a process of its own: `python _build_child.py <spec.json> <lifeline fd>`; or,
when the spec names a "header", the precompiled header that op builds share (precompiled_cache.py),
or when it names an "object", the Python entry's unit that they link (python_entry.py).

Started by compiler.py in a new session. Out of process so that (1) the compiler output can be
captured whole into the log, (2) loading the fresh library to check that it loads does not
register its ops in the parent, which loads the published copy instead, and (3) the build can be
ended as a whole. Imports only torch: it is run as a script, not as part of the package.
"""
import inspect
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # this folder's modules (cache, lock, ...) must not shadow anything torch imports

# Rounds of "kill every process of the session": ninja may start a job while the first round runs.
_KILL_ROUNDS = 3


def die_with_parent(lifeline_fd: int) -> None:
    """End the whole build once the parent is gone: the pipe's only writer is the parent, so a read
    returns end-of-file exactly when it has exited (killed or not) or given up on the build."""

    def watch() -> None:
        while os.read(lifeline_fd, 1):
            pass
        kill_session()

    threading.Thread(target=watch, daemon=True).start()


def kill_session() -> None:
    """SIGKILL every process of this build's session, this one last. ninja puts each compiler job in
    a process group of its own, so the session (which they all share) is what holds the build."""
    session, me = os.getsid(0), os.getpid()
    for _ in range(_KILL_ROUNDS):
        for pid in _pids():
            try:
                if pid != me and os.getsid(pid) == session:
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass  # gone already, or not ours to see
        time.sleep(0.05)
    os.killpg(os.getpgrp(), signal.SIGKILL)  # where /proc is missing: at least ninja and us


def _pids() -> list:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def build(spec: dict) -> None:
    from torch.utils.cpp_extension import load

    # is_python_module=False: a plain library, loaded (the check that it loads) with torch.ops.load_library.
    load(name=spec["name"], sources=spec["sources"], extra_cflags=spec["cxx_flags"],
         extra_cuda_cflags=spec["nvcc_flags"], extra_ldflags=spec.get("ldflags", []),
         extra_include_paths=spec["include_dirs"],
         build_directory=spec["build_dir"], with_cuda=spec["with_gpu"], verbose=True,
         is_python_module=False)


def precompile(spec: dict) -> None:
    """Compile spec's header into spec's .gch with the compiler and the flags torch's extension
    builder gives each C++ unit of an op (GCC uses a .gch only where they match), less
    TORCH_EXTENSION_NAME, which differs per op, then spec's own flags (the op's, as in a build)."""
    compile_as_torch_does(spec, ["-x", "c++-header", spec["header"]])


def compile_object(spec: dict) -> None:
    """Compile spec's source into spec's object as torch's extension builder compiles an op's C++ unit."""
    compile_as_torch_does(spec, ["-c", spec["object"]], [f"-I{folder}" for folder in spec["include_dirs"]])


def compile_as_torch_does(spec: dict, what: list[str], includes: list[str] | None = None) -> None:
    """One compiler run into spec's output: torch's compiler and C++ flags, then spec's, then ``what``."""
    cxx, torch_flags = torch_cxx_command(spec["build_dir"])
    command = [*cxx, *(includes or []), *torch_flags, *spec["cxx_flags"], *what, "-o", spec["output"]]
    print(shlex.join(command), flush=True)
    subprocess.run(command, check=True)


def torch_cxx_command(scratch: str):
    """(compiler, flags) of a C++ unit as torch's extension builder writes them into its build.ninja,
    read from one it writes for a probe. The writer is private to torch, so what it takes is
    checked: a torch that changed it gets no precompiled header (and says why), never a wrong one."""
    from torch.utils import cpp_extension

    ninja_file = os.path.join(scratch, "probe.ninja")
    arguments = dict(path=ninja_file, name="apex_probe", sources=[os.path.join(scratch, "probe.cpp")],
                     extra_cflags=[], extra_cuda_cflags=[], extra_sycl_cflags=[], extra_ldflags=[],
                     extra_include_paths=[], with_cuda=False, with_sycl=False, is_standalone=False)
    try:
        writer = cpp_extension._write_ninja_file_to_build_library
        accepted = inspect.signature(writer).parameters
        writer(**{name: value for name, value in arguments.items() if name in accepted})
        with open(ninja_file) as written:
            variables = dict(line.split(" = ", 1) for line in written.read().splitlines()
                             if " = " in line and not line.startswith(" "))
        os.unlink(ninja_file)
        cxx, cflags = shlex.split(variables["cxx"]), shlex.split(variables["cflags"])
    except (AttributeError, TypeError, KeyError, ValueError, OSError) as error:
        raise RuntimeError(f"this torch's extension builder does not write its compile flags as apex expects "
                           f"({type(error).__name__}: {error}); no precompiled header") from error
    post_cflags = shlex.split(variables.get("post_cflags", ""))
    return cxx, [flag for flag in cflags + post_cflags if not flag.startswith("-DTORCH_EXTENSION_NAME=")]


if __name__ == "__main__":
    die_with_parent(int(sys.argv[2]))
    with open(sys.argv[1]) as spec_file:
        build_spec = json.load(spec_file)
    try:
        if "header" in build_spec:
            precompile(build_spec)
        elif "object" in build_spec:
            compile_object(build_spec)
        else:
            build(build_spec)
    except Exception as error:  # the parent turns the log into an OpBuildError; this is its last line
        print(f"\n{type(error).__name__}: {' '.join(str(error).split())}", flush=True)
        sys.exit(1)
