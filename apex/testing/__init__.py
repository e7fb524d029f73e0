"""apex.testing: helpers apex's own test suites import (ROCm apex's apex.testing)."""
