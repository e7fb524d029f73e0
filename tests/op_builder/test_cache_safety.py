"""The cache directory is private: created 0700, refused when others own it or can write to it."""
import os
import stat

import pytest

from op_builder import cache
from op_builder.errors import UnsafeCacheDirError


def test_cache_dir_is_created_private(tmp_path, monkeypatch):
    target = tmp_path / "fresh" / "apex"
    monkeypatch.setenv("APEX_CACHE_DIR", str(target))
    assert cache.root() == target
    assert stat.S_IMODE(target.stat().st_mode) == 0o700


def test_default_cache_dir_is_under_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("APEX_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.root() == tmp_path / "apex"


def test_world_writable_cache_dir_is_refused(tmp_path, monkeypatch):
    target = tmp_path / "open"
    target.mkdir()
    target.chmod(0o777)
    monkeypatch.setenv("APEX_CACHE_DIR", str(target))
    with pytest.raises(UnsafeCacheDirError, match="writable by group or others \\(mode 0777\\)"):
        cache.root()


@pytest.mark.skipif(os.getuid() != 0, reason="making a directory owned by another user needs root")
def test_cache_dir_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    target = tmp_path / "theirs"
    target.mkdir(mode=0o700)
    os.chown(target, 12345, 12345)
    monkeypatch.setenv("APEX_CACHE_DIR", str(target))
    with pytest.raises(UnsafeCacheDirError, match="belongs to uid 12345, not to you"):
        cache.root()


def test_foreign_owner_check_without_root(tmp_path, monkeypatch):
    """The same refusal where tests cannot chown: pretend to be someone else."""
    target = tmp_path / "mine"
    target.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: target.stat().st_uid + 1)
    monkeypatch.setenv("APEX_CACHE_DIR", str(target))
    with pytest.raises(UnsafeCacheDirError, match="not to you"):
        cache.root()
