"""Where things are: the C++/CUDA sources (inside the installed package, or the checkout's csrc/)
and the libraries prebuilt into the wheel."""
from __future__ import annotations

from pathlib import Path

# The op_builder folder itself (in the source tree apex/op_builder is a link to it).
PACKAGE_DIR = Path(__file__).resolve().parent
# Prebuilt libraries (APEX_BUILD_<NAME>=1 at install) land here, each beside a manifest.
PREBUILT_DIR = PACKAGE_DIR / "_prebuilt"
PREBUILD_SKIPPED = "skipped.json"  # in PREBUILT_DIR: op -> why it was not prebuilt
# Written into the wheel at build time: apex's version and the commit it was built from.
BUILD_INFO = PACKAGE_DIR / "_build_info.json"


def csrc_root() -> Path:
    installed = PACKAGE_DIR / "csrc"   # setup.py installs csrc/ as apex/op_builder/csrc
    return installed if installed.is_dir() else PACKAGE_DIR.parent / "csrc"


def source_checkout() -> Path | None:
    """The checkout this package runs from, or None when it is installed."""
    root = PACKAGE_DIR.parent
    return root if (root / "csrc").is_dir() and not (PACKAGE_DIR / "csrc").is_dir() else None
