#!/usr/bin/env python3
"""Remove build outputs (build/, dist/, *.egg-info, prebuilt modules) and this checkout's JIT cache entries.

    python scripts/clean.py [--all-cache]

Cache entries are this checkout's when their meta.json names this checkout's
csrc/ as source root; --all-cache removes the whole cache directory instead.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from op_builder import cache  # noqa: E402


def _remove(path: Path) -> None:
    print(f"removing {path}")
    shutil.rmtree(path) if path.is_dir() else path.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--all-cache", action="store_true", help="remove the whole JIT cache directory")
    args = parser.parse_args(argv)
    for path in [REPO / "build", REPO / "dist", *REPO.glob("*.egg-info"), REPO / "op_builder" / "_prebuilt"]:
        if path.exists():
            _remove(path)
    root = cache.root()
    if args.all_cache:
        _remove(root)
        return 0
    ours = str((REPO / "csrc").resolve())
    for meta in root.glob(f"*/*/{cache.META}"):
        if json.loads(meta.read_text()).get("source_root") == ours:
            _remove(meta.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
