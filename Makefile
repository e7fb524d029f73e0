# apex: the everyday commands.
#
# PYTHON is the interpreter every target uses, and the one it prints first. By default: the active
# virtual environment's ($VIRTUAL_ENV), else this checkout's .venv, which `make` creates when it is
# missing (with --system-site-packages, so a torch already installed system-wide is reused, not
# downloaded again). `make test PYTHON=/path/to/python` picks another. make pip-installs only
# into a virtual environment (venv or conda env), never into a system Python.
VENV ?= .venv
PYTHON ?= $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV)/bin/python,$(VENV)/bin/python)
# Parallel compile jobs for op builds; 2 keeps a small machine responsive.
export MAX_JOBS ?= 2
# A benchmark exits with this status when it needs a GPU and none is visible (benchmarks/common.py).
BENCH_SKIPPED := 77
BENCHMARKS ?= benchmarks

# Exits non-zero, saying why, unless the interpreter runs in a virtual environment.
IN_VENV = import os, sys; sys.exit(0 if sys.prefix != sys.base_prefix or os.path.isdir(os.path.join(sys.prefix, "conda-meta")) else f"make: {sys.executable} is not in a virtual environment, so make will not pip-install into it. Run make without PYTHON= (it uses $(VENV)), activate a venv, or pass PYTHON=<venv>/bin/python.")
PIP_INSTALL = $(PYTHON) -c '$(IN_VENV)' && $(PYTHON) -m pip install --disable-pip-version-check
# PYTHON as an absolute path (for recipes that leave the checkout); a bare name stays as it is.
PYTHON_PATH = $(if $(findstring /,$(PYTHON)),$(abspath $(PYTHON)),$(PYTHON))

.PHONY: deps install test test-installed test-gpu bench demo clean report

$(VENV)/bin/python:
	python3 -m venv --system-site-packages $(VENV)

# What the commands below need besides apex itself (torch is left alone if present).
deps: $(filter $(VENV)/bin/python,$(PYTHON))
	@$(PYTHON) -c 'import sys; print(f"make: using {sys.executable} (Python {sys.version.split()[0]})")'
	@$(PYTHON) -c "import torch" 2>/dev/null || ($(PIP_INSTALL) torch)
	@$(PYTHON) -c "import pytest, ninja, numpy, setuptools, wheel, expecttest" 2>/dev/null || \
	  ($(PIP_INSTALL) pytest ninja numpy setuptools wheel expecttest)

install: deps
	$(PIP_INSTALL) --no-build-isolation .

# The CPU suite from this checkout; tests marked gpu are deselected (`make test-gpu` runs them).
# Op builds announce themselves live despite pytest's capture (tests/conftest.py).
# TESTS=tests/op_builder runs a part.
TESTS ?=
test: deps
	$(PYTHON) -m pytest -m "not gpu" -q $(TESTS)

# The same suite against the wheel installed in PYTHON, run from outside the checkout.
test-installed: install
	cd "$$(mktemp -d)" && "$(PYTHON_PATH)" -m pytest "$(CURDIR)/tests" -c "$(CURDIR)/pyproject.toml" \
	  --rootdir "$(CURDIR)" -o pythonpath= -p no:cacheprovider -m "not gpu" -q $(TESTS)

test-gpu: deps
	$(PYTHON) -m pytest -m gpu -q -rs

# Runs every benchmark even if one fails; those that need a GPU say so and are listed as skipped.
bench: deps
	@failed=""; skipped=""; for script in $$(find $(BENCHMARKS) -name 'bench_*.py' | sort); do \
	  echo "== $$script"; PYTHONPATH=.:compatibility $(PYTHON) $$script; status=$$?; \
	  if [ $$status -eq $(BENCH_SKIPPED) ]; then skipped="$$skipped $$script"; \
	  elif [ $$status -ne 0 ]; then failed="$$failed $$script"; fi; done; \
	if [ -n "$$skipped" ]; then echo "needs a GPU (skipped here):$$skipped"; fi; \
	if [ -n "$$failed" ]; then echo "failed:$$failed"; exit 1; fi

demo: install
	$(PYTHON) examples/gpt_demo.py

report: deps
	PYTHONPATH=.:compatibility $(PYTHON) -m apex.report

# Needs no torch: any Python does when PYTHON does not exist (yet).
clean:
	$(if $(wildcard $(PYTHON)),$(PYTHON),python3) scripts/clean.py
