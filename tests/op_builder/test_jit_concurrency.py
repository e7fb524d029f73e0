"""Many processes at once, and builds killed half way: the whole build dies with its owner."""
import os
import signal
import subprocess
import time
from pathlib import Path

from apex.op_builder import compiler
from apex.op_builder.builder import CppOpBuilder
from apex.op_builder.plan import Purpose, plan_build
from jit_helpers import LOAD_TINY, python_env, run_python, start_python

RANKS = 4


def test_concurrent_first_use_compiles_once_and_all_load(cache_dir, tiny_root):
    env = python_env(cache_dir)
    procs = [start_python(LOAD_TINY, env, str(tiny_root)) for _ in range(RANKS)]
    results = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in results]
    assert all("answer 42" in out for out, _ in results)
    compiles = sum(err.count("apex: compiling op 'tiny_op'") for _, err in results)
    assert compiles == 1
    assert not list((cache_dir / "tiny_op").glob("*.lock")), "lock files pile up in the cache"


def _stuck_compiler(tmp_path: Path) -> tuple[str, Path]:
    """A CXX whose compile jobs (ninja's, not torch's compiler probes) record their pid and never
    finish: what a long cc1plus job looks like."""
    pid_file = tmp_path / "compiler.pid"
    script = tmp_path / "stuck-c++"
    script.write_text('#!/bin/sh\ncase " $* " in *" -c "*) ;; *) exec c++ "$@" ;; esac\n'
                      f"echo $$ > {pid_file}\nexec sleep 300\n")
    script.chmod(0o755)
    return str(script), pid_file


def _running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may never reap the orphans it inherits)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_for(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_sigkill_mid_build_kills_the_compilers_and_the_next_import_cleans_up(cache_dir, tiny_root, tmp_path):
    compiler_cmd, pid_file = _stuck_compiler(tmp_path)
    victim = start_python(LOAD_TINY, python_env(cache_dir, CXX=compiler_cmd), str(tiny_root))
    _wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), "the compiler never started")
    compiler_pid = int(pid_file.read_text())
    (scratch,) = [p for p in (cache_dir / "tiny_op").glob(".tmp-*") if p.is_dir()]

    os.kill(victim.pid, signal.SIGKILL)  # not reaped yet: a zombie, as a killed rank often stays a while
    _wait_for(lambda: not _running(compiler_pid), "the compiler outlived the process that started the build", 30)
    assert not [p for p in (cache_dir / "tiny_op").iterdir() if p.is_dir() and not p.name.startswith(".")], \
        "a killed build published an entry"

    started = time.monotonic()
    survivor = run_python(LOAD_TINY, python_env(cache_dir), str(tiny_root))
    assert survivor.returncode == 0, survivor.stderr
    assert "answer 42" in survivor.stdout
    assert time.monotonic() - started < 120  # the dead holder's lock was not waited on
    assert not scratch.exists(), "the dead build's scratch dir was not removed"
    assert not list((cache_dir / "tiny_op").glob(".tmp-*")), "scratch leftovers"
    victim.wait()


def test_build_child_starts_without_preexec_fn_in_a_session_of_its_own(tiny_root, tmp_path, monkeypatch):
    """preexec_fn (and a ctypes call in it) in a multi-threaded torch process can deadlock."""
    seen = {}
    real_popen = subprocess.Popen

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real_popen(*args, **kwargs)

    class Tiny(CppOpBuilder):
        NAME = "tiny_op"
        SOURCE_DIR = "tiny"

    monkeypatch.setattr(compiler.subprocess, "Popen", spy)
    plan = plan_build(Tiny(source_root=tiny_root), Purpose.CHECK)
    build_dir = tmp_path / "build"
    build_dir.mkdir()
    compiler.compile_library(plan, build_dir, failed_log=tmp_path / "failed.log")
    assert seen.get("preexec_fn") is None and seen["start_new_session"] is True
    assert (build_dir / "tiny_op.so").is_file()
