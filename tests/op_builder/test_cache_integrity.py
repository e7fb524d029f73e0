"""A corrupt library (cache entry or prebuilt) is never loaded: it is rebuilt, with a one-line notice.

A truncated cached .so used to kill the process with SIGBUS (exit 135); one of random bytes gave an
ImportError with no hint.
"""
import os


from apex.op_builder import integrity, jit
from apex.op_builder.builder import CppOpBuilder
from apex.op_builder.plan import Purpose, plan_build
from jit_helpers import LOAD_TINY, python_env, run_python


def _library(cache_dir):
    (library,) = (cache_dir / "tiny_op").glob("*/tiny_op.so")
    return library


def _truncate(path):
    with open(path, "r+b") as file:
        file.truncate(path.stat().st_size // 2)


def _randomise(path):
    path.write_bytes(os.urandom(path.stat().st_size))


def test_corrupt_cache_entry_is_rebuilt_with_a_notice(cache_dir, tiny_root, failing_compiler):
    env = python_env(cache_dir)
    assert "answer 42" in run_python(LOAD_TINY, env, str(tiny_root)).stdout
    for corrupt in (_truncate, _randomise):
        corrupt(_library(cache_dir))
        result = run_python(LOAD_TINY, env, str(tiny_root))
        assert result.returncode == 0, (corrupt.__name__, result.returncode, result.stderr)  # not -7 (SIGBUS)
        assert "answer 42" in result.stdout
        notices = [line for line in result.stderr.splitlines() if "is corrupt" in line]
        assert len(notices) == 1 and "rebuilding it" in notices[0], result.stderr
        assert integrity.problem(_library(cache_dir), _meta_library(cache_dir)) is None

    hit = run_python(LOAD_TINY, python_env(cache_dir, CXX=failing_compiler), str(tiny_root))
    assert hit.returncode == 0 and hit.stderr.strip() == "", hit.stderr  # repaired for good


def _meta_library(cache_dir):
    import json

    (meta,) = (cache_dir / "tiny_op").glob("*/meta.json")
    return json.loads(meta.read_text())["library"]


def test_integrity_problem_names_what_is_wrong(tmp_path):
    library = tmp_path / "op.so"
    library.write_bytes(b"\x7fELF" + b"x" * 100)
    recorded = integrity.record(library)
    assert integrity.problem(library, recorded) is None
    library.write_bytes(b"\x7fELF")
    assert "4 bytes, 104 were built" in integrity.problem(library, recorded)
    library.write_bytes(b"\x7fELF" + b"y" * 100)
    assert "checksum" in integrity.problem(library, recorded)
    assert "never recorded" in integrity.problem(library, {"file": "op.so"})
    library.unlink()
    assert "missing" in integrity.problem(library, recorded)


def test_corrupt_prebuilt_library_falls_back_to_a_jit_build(tiny_root, tmp_path, monkeypatch):
    class Tiny(CppOpBuilder):
        NAME = "tiny_op"
        SOURCE_DIR = "tiny"

    plan = plan_build(Tiny(source_root=tiny_root), Purpose.JIT)
    prebuilt = tmp_path / "prebuilt"
    prebuilt.mkdir()
    library = prebuilt / "tiny_op.so"
    library.write_bytes(b"a prebuilt library")
    manifest = {"fingerprint": plan.fingerprint, **integrity.record(library)}
    monkeypatch.setattr(jit.paths, "PREBUILT_DIR", prebuilt)
    monkeypatch.setattr(jit, "prebuilt_manifest", lambda name: manifest)
    assert jit.find_prebuilt(plan) == (library, "")

    _truncate(library)
    path, why_not = jit.find_prebuilt(plan)
    assert path is None and why_not.startswith("is corrupt (the library is 9 bytes")
