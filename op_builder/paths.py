"""Where the C++/CUDA sources are: shipped inside the installed package, or the checkout's csrc/."""
from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# Prebuilt modules (APEX_BUILD_<NAME>=1 at install) land here, each beside a manifest.
PREBUILT_DIR = PACKAGE_DIR / "_prebuilt"


def csrc_root() -> Path:
    installed = PACKAGE_DIR / "csrc"   # setup.py installs csrc/ as op_builder/csrc
    return installed if installed.is_dir() else PACKAGE_DIR.parent / "csrc"
