"""`python -m apex.report` and the README's op table."""
import re

from apex import report
from apex.op_builder import all_builders
from jit_helpers import REPO, python_env, run_python

REPORT = "import sys; from apex.report import main; sys.exit(main())"


def test_report_runs_and_lists_every_op(cache_dir):
    result = run_python(REPORT, python_env(cache_dir))
    assert result.returncode == 0, result.stderr
    for field in ("apex", "torch", "nvcc", "ninja", "C++ compiler", "CPU build flags", "GPUs", "cache dir",
                  "precompiled headers"):
        assert re.search(rf"^  {re.escape(field)}\s", result.stdout, re.M), field
    assert re.search(r"^  apex\s+\d+\.\d+\.\d+\S*, commit ([0-9a-f]{7,}|unknown)", result.stdout, re.M), result.stdout
    for name, cls in all_builders().items():
        assert re.search(rf"^\s+{name}\s+(yes|no: .+)\s+(prebuilt|cached|not built|-)\b.*{cls.build_var()}",
                         result.stdout, re.M), name


def test_a_refused_cache_dir_is_a_row_not_a_traceback(tmp_path):
    """It used to crash with an UnsafeCacheDirError traceback."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    result = run_python(REPORT, python_env(shared))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert re.search(r"^  cache dir\s+REFUSED: apex refuses the cache directory", result.stdout, re.M)
    assert "cache refused" in result.stdout  # the op rows say why they have no status


def test_precompiled_headers_row_says_off_or_whether_built(cache_dir):
    env = python_env(cache_dir)
    env.pop("APEX_PCH", None)
    fresh = run_python(REPORT, env)
    assert re.search(r"^  precompiled headers\s+(not built: |not used here )", fresh.stdout, re.M), fresh.stdout
    off = run_python(REPORT, {**env, "APEX_PCH": "0"})
    assert re.search(r"^  precompiled headers\s+off \(APEX_PCH=0\)", off.stdout, re.M), off.stdout
    bad = run_python(REPORT, {**env, "APEX_PCH": "maybe"})
    assert bad.returncode == 0 and re.search(r"^  precompiled headers\s+REFUSED: APEX_PCH='maybe'", bad.stdout, re.M)


def test_cpu_build_flags_are_the_ones_jit_builds_use():
    from apex.op_builder import toolchain

    (flags,) = [value for key, value in report.environment() if key == "CPU build flags"]
    for flag in [*toolchain.openmp_flags(), *toolchain.host_cpu_flags()]:
        assert flag in flags


def test_readme_op_table_is_current():
    """Adding an op never needs a hand edit of README.md: a stale table is rewritten here."""
    readme = REPO / "README.md"
    if report.update_readme(readme):
        raise AssertionError("README.md's op table was stale and has been regenerated from the registry "
                             "(`python -m apex.report --update-readme README.md`): review and commit it.")
    assert report.op_table_markdown() in readme.read_text()


def test_readme_table_update_replaces_only_the_table(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\n{report.OP_TABLE_MARKER} -->\n| old | table |\n| --- | --- |\n\nafter\n")
    assert report.update_readme(readme) is True
    text = readme.read_text()
    assert text.startswith("# title\n\n") and text.endswith("\n\nafter\n") and "| old |" not in text
    assert report.op_table_markdown() in text
    assert report.update_readme(readme) is False



def test_skipped_prebuilds_are_listed_once_per_reason(monkeypatch, capsys):
    from apex.op_builder import jit

    monkeypatch.setattr(jit, "skipped_prebuilds", lambda: {"op_a": "no nvcc", "op_b": "no nvcc", "op_c": "old torch"})
    report.print_skipped_prebuilds()
    out = capsys.readouterr().out
    assert "op_a, op_b: no nvcc" in out and "op_c: old torch" in out
