#!/usr/bin/env python3
"""Remove build outputs and apex's JIT cache entries; never anything apex did not write.

    python scripts/clean.py [--all-cache]

Build outputs: build/, dist/, *.egg-info and in-place prebuilt libraries of this checkout.
Cache: the entries built from this checkout's sources or from the apex installed in this Python,
and entries whose sources no longer exist (with --all-cache: every entry apex wrote), plus
failed-build logs, dead builds' scratch directories and stale lock files. Only what apex
recognises as its own (meta.json of an entry, its logs' and locks' first line) is removed, so a
cache directory shared with other files (APEX_CACHE_DIR=/scratch/me) keeps them.
"""
from __future__ import annotations

import argparse
import importlib.machinery
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from apex.op_builder import cache  # noqa: E402
from apex.op_builder.errors import UnsafeCacheDirError  # noqa: E402


def _remove(path: Path) -> None:
    print(f"removing {path}")
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def installed_sources() -> Path | None:
    """The csrc/ of the apex installed in this Python (not this checkout), if there is one."""
    elsewhere = [p for p in sys.path if p and Path(p).resolve() != REPO]
    spec = importlib.machinery.PathFinder.find_spec("apex", elsewhere)
    if spec is None or not spec.submodule_search_locations:
        return None
    sources = Path(list(spec.submodule_search_locations)[0]) / "op_builder" / "csrc"
    return sources.resolve() if sources.is_dir() else None


def ours(meta: dict | None, sources: set[str]) -> bool:
    """Whether a cache entry was built from these sources (or from sources that no longer exist)."""
    if meta is None:  # a failed-build log, a dead build's scratch, a stale lock: never needed again
        return True
    root = meta.get("source_root", "")
    return root in sources or not Path(root).is_dir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--all-cache", action="store_true", help="remove every cache entry apex wrote, whatever its sources")
    args = parser.parse_args(argv)
    for path in [REPO / "build", REPO / "dist", *REPO.glob("*.egg-info"), REPO / "op_builder" / "_prebuilt"]:
        if path.exists():
            _remove(path)
    try:
        root = cache.root(create=False)
    except UnsafeCacheDirError as error:
        print(f"the JIT cache was not cleaned: {error}", file=sys.stderr)
        return 1
    if not root.is_dir():
        return 0
    installed = installed_sources()
    sources = {str((REPO / "csrc").resolve())} | ({str(installed)} if installed else set())
    emptied = set()
    for path, meta in list(cache.apex_files(root)):
        if args.all_cache or ours(meta, sources):
            _remove(path)
            emptied.add(path.parent)
    for op_dir in emptied:  # an op's folder this emptied goes too; never the cache root itself
        if not any(op_dir.iterdir()):
            op_dir.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
