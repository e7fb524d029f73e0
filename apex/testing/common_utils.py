"""Skip decorators for apex's unittest suites (ROCm apex's apex.testing.common_utils).

    APEX_TEST_WITH_ROCM=1     skipIfRocm skips its test (a feature the ROCm stack lacks)
    APEX_SKIP_FLAKY_TEST=1    skipFlakyTest skips its test
"""
import os
import unittest
from functools import wraps

TEST_WITH_ROCM = os.getenv("APEX_TEST_WITH_ROCM", "0") == "1"
SKIP_FLAKY_TEST = os.getenv("APEX_SKIP_FLAKY_TEST", "0") == "1"


def _skip_when(condition, reason):
    def decorator(fn):
        @wraps(fn)
        def wrapper(*args, **kwargs):
            if condition:
                raise unittest.SkipTest(reason)
            return fn(*args, **kwargs)

        return wrapper

    return decorator


skipIfRocm = _skip_when(TEST_WITH_ROCM, "test doesn't currently work on ROCm stack.")
skipFlakyTest = _skip_when(SKIP_FLAKY_TEST, "Test is flaky.")

__all__ = ["TEST_WITH_ROCM", "SKIP_FLAKY_TEST", "skipIfRocm", "skipFlakyTest"]
