"""scripts/clean.py (`make clean`): removes what apex wrote in the cache, and nothing else.

`clean.py --all-cache` used to `rm -rf $APEX_CACHE_DIR`: with APEX_CACHE_DIR=/scratch/me it deleted
results.csv beside the cache. `make clean` skipped entries built by the installed package.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

from apex.op_builder import lock
from jit_helpers import LOAD_TINY, REPO, python_env, run_python

CLEAN = REPO / "scripts" / "clean.py"


def _entry(cache_dir: Path, op: str, key: str, source_root: Path) -> Path:
    """A cache entry as apex writes one (meta.json names it)."""
    entry = cache_dir / op / key
    entry.mkdir(parents=True)
    (entry / f"{op}.so").write_bytes(b"library")
    (entry / "meta.json").write_text(json.dumps({"apex_cache_entry": 1, "op": op, "key": key,
                                                 "source_root": str(source_root)}))
    return entry


def _clean(cache_dir: Path, *args: str, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = python_env(cache_dir)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, env["PYTHONPATH"]])
    return subprocess.run([sys.executable, str(CLEAN), *args], env=env, capture_output=True, text=True, timeout=120)


def test_all_cache_in_a_shared_directory_removes_only_apex_files(tmp_path, tiny_root):
    scratch = tmp_path / "scratch-me"  # APEX_CACHE_DIR=/scratch/me, beside the user's own work
    scratch.mkdir(mode=0o700)
    assert "answer 42" in run_python(LOAD_TINY, python_env(scratch), str(tiny_root)).stdout
    users = {scratch / "results.csv": "loss\n0.1\n", scratch / "runs" / "meta.json": '{"op": "runs"}',
             scratch / "tiny_op" / "notes.txt": "mine", scratch / "runs" / "0123456789abcdef0123" / "meta.json": "{}",
             scratch / "tiny_op" / "0123456789abcdef0123.lock": "my own lock file"}
    for path, text in users.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (scratch / "tiny_op" / "fedcba98765432100123.failed.log").write_text("# apex build log of op 'tiny_op'\n")
    (scratch / "tiny_op" / "fedcba98765432100123.lock").write_text(f"{lock.MARKER}12345")  # left by an old build

    result = _clean(scratch, "--all-cache")
    assert result.returncode == 0, result.stderr
    for path, text in users.items():
        assert path.read_text() == text, f"{path} was touched"
    left = sorted(p.name for p in (scratch / "tiny_op").iterdir())
    assert left == ["0123456789abcdef0123.lock", "notes.txt"], left
    assert scratch.is_dir()


def test_all_cache_removes_dead_scratch_dirs_and_empty_op_dirs_but_never_the_root(tmp_path):
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    _entry(cache_dir, "tiny_op", "e" * 20, tmp_path / "src")
    owner = cache_dir / "tiny_op" / ".tmp-0123456789abcdef0123-abc.owner"  # its builder was killed
    owner.write_text(f"{lock.MARKER}99999")
    (cache_dir / "tiny_op" / ".tmp-0123456789abcdef0123-abc").mkdir()
    assert _clean(cache_dir, "--all-cache").returncode == 0
    assert cache_dir.is_dir() and list(cache_dir.iterdir()) == []


def test_make_clean_removes_this_checkouts_the_installed_and_orphaned_entries(tmp_path):
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    site = tmp_path / "site"  # an installed apex: its sources are apex/op_builder/csrc
    (site / "apex" / "op_builder" / "csrc").mkdir(parents=True)
    (site / "apex" / "__init__.py").write_text("")
    other_checkout = tmp_path / "other-checkout" / "csrc"
    other_checkout.mkdir(parents=True)
    checkout = _entry(cache_dir, "amp_C", "a" * 20, (REPO / "csrc").resolve())
    installed = _entry(cache_dir, "amp_C", "b" * 20, (site / "apex" / "op_builder" / "csrc").resolve())
    orphaned = _entry(cache_dir, "amp_C", "c" * 20, tmp_path / "deleted-venv" / "csrc")
    kept = _entry(cache_dir, "amp_C", "d" * 20, other_checkout)

    result = _clean(cache_dir, pythonpath=str(site))
    assert result.returncode == 0, result.stderr
    assert not checkout.exists() and not installed.exists() and not orphaned.exists()
    assert kept.exists()


def test_a_refused_cache_is_reported_not_cleaned(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "results.csv").write_text("mine")
    result = _clean(shared, "--all-cache")
    assert result.returncode == 1 and "not cleaned: apex refuses the cache directory" in result.stderr
    assert (shared / "results.csv").read_text() == "mine"
