"""`python -m apex.report` and the README's op table."""
import re

from apex import report
from jit_helpers import REPO, python_env, run_python
from op_builder import all_builders


def test_report_runs_and_lists_every_op(cache_dir):
    result = run_python("from apex.report import main; main()", python_env(cache_dir))
    assert result.returncode == 0, result.stderr
    for field in ("torch", "nvcc", "ninja", "C++ compiler", "GPUs", "cache dir"):
        assert field in result.stdout
    for name, cls in all_builders().items():
        assert re.search(rf"^\s+{name}\s+yes\s+(prebuilt|cached|not built)\s+{cls.build_var()}", result.stdout, re.M)


def test_readme_op_table_is_current():
    readme = (REPO / "README.md").read_text()
    assert report.op_table_markdown() in readme, "README.md's op table is stale: paste `python -m apex.report --op-table`"


def test_every_op_has_a_historical_module_name():
    for name in all_builders():
        assert (REPO / "compatibility" / f"{name}.py").is_file(), f"compatibility/{name}.py is missing"
