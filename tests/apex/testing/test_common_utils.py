"""apex.testing.common_utils: the skip decorators follow APEX_TEST_WITH_ROCM / APEX_SKIP_FLAKY_TEST."""
import importlib
import unittest

import pytest

import apex.testing.common_utils as common_utils


@pytest.fixture
def reload_with(monkeypatch):
    """Reload common_utils with the given environment; the original module is restored afterwards."""

    def reload(**env):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return importlib.reload(common_utils)

    yield reload
    monkeypatch.undo()
    importlib.reload(common_utils)


@pytest.mark.parametrize("variable,flag,decorator", [
    ("APEX_TEST_WITH_ROCM", "TEST_WITH_ROCM", "skipIfRocm"),
    ("APEX_SKIP_FLAKY_TEST", "SKIP_FLAKY_TEST", "skipFlakyTest"),
])
def test_decorators_skip_only_when_asked(reload_with, variable, flag, decorator):
    def check(value):
        """docstring kept"""
        return value * 2

    module = reload_with(**{variable: "0"})
    assert getattr(module, flag) is False
    wrapped = getattr(module, decorator)(check)
    assert wrapped(21) == 42 and wrapped.__name__ == "check" and wrapped.__doc__ == "docstring kept"

    module = reload_with(**{variable: "1"})
    assert getattr(module, flag) is True
    with pytest.raises(unittest.SkipTest):
        getattr(module, decorator)(check)(21)


def test_unittest_reports_a_skip(reload_with):
    module = reload_with(APEX_SKIP_FLAKY_TEST="1")

    class Case(unittest.TestCase):
        @module.skipFlakyTest
        def test_flaky(self):
            raise AssertionError("must not run")

    result = unittest.TestResult()
    Case("test_flaky").run(result)
    assert len(result.skipped) == 1 and result.wasSuccessful()
