"""Many processes at once, and builds killed half way."""
import os
import signal
import time
from pathlib import Path

from jit_helpers import LOAD_TINY, python_env, run_python, start_python

RANKS = 6


def test_concurrent_first_use_compiles_once_and_all_load(cache_dir, tiny_root):
    env = python_env(cache_dir)
    procs = [start_python(LOAD_TINY, env, str(tiny_root)) for _ in range(RANKS)]
    results = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in results]
    assert all("answer 42" in out for out, _ in results)
    compiles = sum(err.count("apex: compiling op 'tiny_op'") for _, err in results)
    assert compiles == 1


def _slow_compiler(tmp_path: Path) -> str:
    script = tmp_path / "slow-c++"
    script.write_text("#!/bin/sh\nsleep 30\nexec c++ \"$@\"\n")
    script.chmod(0o755)
    return str(script)


def test_sigkill_mid_build_leaves_nothing_loadable_and_next_import_succeeds(cache_dir, tiny_root, tmp_path):
    victim = start_python(LOAD_TINY, python_env(cache_dir, CXX=_slow_compiler(tmp_path)), str(tiny_root))
    deadline = time.monotonic() + 120
    while not list((cache_dir / "tiny_op").glob(".tmp-*/build.ninja")):  # the build is under way
        assert time.monotonic() < deadline, "the build never started"
        assert victim.poll() is None, victim.communicate()
        time.sleep(0.2)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert not [p for p in (cache_dir / "tiny_op").iterdir() if p.is_dir() and not p.name.startswith(".")], \
        "a killed build published an entry"

    started = time.monotonic()
    survivor = run_python(LOAD_TINY, python_env(cache_dir), str(tiny_root))
    assert survivor.returncode == 0, survivor.stderr
    assert "answer 42" in survivor.stdout
    assert time.monotonic() - started < 120  # the dead holder's lock was not waited on
    assert not list((cache_dir / "tiny_op").glob(".tmp-*")), "the dead build's scratch dir was not removed"
