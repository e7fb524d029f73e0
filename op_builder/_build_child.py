"""One op build, in a process of its own: `python _build_child.py <spec.json> <lifeline fd>`.

Started by compiler.py in a new session. Out of process so that (1) the compiler output can be
captured whole into the log, (2) loading the fresh library to check that it loads does not
register its ops in the parent, which loads the published copy instead, and (3) the build can be
ended as a whole. Imports only torch: it is run as a script, not as part of the package.
"""
import json
import os
import signal
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
         extra_cuda_cflags=spec["nvcc_flags"], extra_include_paths=spec["include_dirs"],
         build_directory=spec["build_dir"], with_cuda=spec["with_gpu"], verbose=True,
         is_python_module=False)


if __name__ == "__main__":
    die_with_parent(int(sys.argv[2]))
    with open(sys.argv[1]) as spec_file:
        build_spec = json.load(spec_file)
    try:
        build(build_spec)
    except Exception as error:  # the parent turns the log into an OpBuildError; this is its last line
        print(f"\n{type(error).__name__}: {' '.join(str(error).split())}", flush=True)
        sys.exit(1)
