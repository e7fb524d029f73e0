"""The cache directory is private: created 0700, refused when others own it or can write to it or to
a non-sticky directory above it; the advice never asks to change a shared directory."""
import os
import stat

import pytest

from apex.op_builder import cache
from apex.op_builder.errors import UnsafeCacheDirError


@pytest.fixture
def group_writable_umask():
    previous = os.umask(0o002)
    yield
    os.umask(previous)


def test_cache_dir_is_created_private_with_its_missing_parents(tmp_path, monkeypatch, group_writable_umask):
    target = tmp_path / "fresh" / "apex"  # the umask must not leak into the parents it creates
    monkeypatch.setenv("APEX_CACHE_DIR", str(target))
    assert cache.root() == target
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700


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


def test_shared_tmp_gets_a_private_subdirectory_as_advice_never_chmod(tmp_path, monkeypatch):
    """APEX_CACHE_DIR=/tmp used to get "Run `chmod 700 /tmp`"."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: world-writable and sticky
    monkeypatch.setenv("APEX_CACHE_DIR", str(shared))
    with pytest.raises(UnsafeCacheDirError) as caught:
        cache.root()
    message = str(caught.value)
    assert "chmod" not in message
    assert f"APEX_CACHE_DIR={shared}/apex-" in message  # a private subdirectory of it, which is accepted:
    monkeypatch.setenv("APEX_CACHE_DIR", message.split("APEX_CACHE_DIR=")[1].split(" ")[0])
    private = cache.root()
    assert stat.S_IMODE(private.stat().st_mode) == 0o700


def test_cache_below_a_directory_others_can_write_is_refused(tmp_path, monkeypatch):
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o775)  # group-writable, not sticky: a teammate could rename the cache away
    target = team / "me" / "apex"
    target.mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("APEX_CACHE_DIR", str(target))
    with pytest.raises(UnsafeCacheDirError, match=f"its parent {team} is writable by other users") as caught:
        cache.root()
    assert "chmod" not in str(caught.value)


def test_cache_below_a_sticky_shared_directory_is_accepted(tmp_path, monkeypatch):
    shared = tmp_path / "scratch"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("APEX_CACHE_DIR", str(shared / "apex-me"))
    assert cache.root() == shared / "apex-me"


def test_nothing_is_created_below_a_refused_parent(tmp_path, monkeypatch):
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o777)
    monkeypatch.setenv("APEX_CACHE_DIR", str(team / "apex"))
    with pytest.raises(UnsafeCacheDirError):
        cache.root()
    assert not (team / "apex").exists()


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
