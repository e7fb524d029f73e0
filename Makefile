# apex: the everyday commands. PYTHON may name a venv's python (make test PYTHON=.venv/bin/python).
PYTHON ?= python3
# Parallel compile jobs for op builds; 2 keeps a small machine responsive.
export MAX_JOBS ?= 2

.PHONY: deps install test test-gpu bench demo clean report

# What the commands below need besides apex itself (torch is left alone if present).
deps:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install torch
	@$(PYTHON) -c "import pytest, ninja" 2>/dev/null || $(PYTHON) -m pip install pytest ninja numpy

install: deps
	$(PYTHON) -m pip install --no-build-isolation .

test: deps
	$(PYTHON) -m pytest -m "not gpu" -q

test-gpu: deps
	$(PYTHON) -m pytest -m gpu -q -rs

# Runs every benchmark even if one fails; fails at the end if any did.
bench: deps
	@failed=""; for script in $$(find benchmarks -name 'bench_*.py' | sort); do \
	  echo "== $$script"; PYTHONPATH=.:compatibility $(PYTHON) $$script || failed="$$failed $$script"; done; \
	  if [ -n "$$failed" ]; then echo "failed:$$failed"; exit 1; fi

demo: install
	$(PYTHON) examples/gpt_demo.py

report:
	PYTHONPATH=.:compatibility $(PYTHON) -m apex.report

clean:
	$(PYTHON) scripts/clean.py
