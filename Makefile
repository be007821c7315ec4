# Two commands do all the set-up on a fresh machine (Python 3.11 with venv):
#   make demo   creates .venv, installs everything, runs the quick start on the embedded default
#   make test   creates .venv, installs everything, runs ruff and the whole test suite
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
# make test runs the suite in this many pytest-xdist workers (a test module, with its backend spec,
# is one unit of work: tests/conftest.py); TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= 2
# The ColBERT head of load_encoder(dense=..., tokens=...) and multi-vector model folders run
# sentence-transformers 6 (the colbert extra, part of all and so of test): no PyLate, no --no-deps,
# and pip check must report nothing at all.

# the fused MaxSim kernel is compiled by the editable install: a changed kernel source installs again
$(VENV)/.installed: pyproject.toml src/uibk_embedding/_maxsim_kernel.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip check
	touch $@

# PyLate's own environment, for benchmarks/pylate_interop.py and tests/test_pylate_interop.py only:
# PyLate 1.6.0 pins sentence-transformers==5.3.0 and transformers<=5.3.0 (against the colbert
# extra's >= 6) and fast-plaid<=1.4.6.2110 (against the plaid extra's 1.7.0.2110, on which its PLAID
# index runs too). So the package goes in with plaid and bench, then PyLate's other requirements
# (its 1.6.0 METADATA less fast-plaid), then PyLate with --no-deps; pip check there reports
# PyLate's fast-plaid pin, and nothing else may appear.
PYLATE_VENV ?= .venv-pylate
PYLATE := pylate==1.6.0
PYLATE_DEPS := 'sentence-transformers==5.3.0' 'transformers>=4.41.0,<=5.3.0' 'datasets>=2.20.0' \
	'accelerate>=0.31.0' 'pandas>=2.2.1' 'ujson==5.12.0' 'ninja==1.11.1.4' 'fastkmeans==0.5.0' \
	'pytest>=9' 'pytest-timeout>=2.3'

$(PYLATE_VENV)/.installed: pyproject.toml src/uibk_embedding/_maxsim_kernel.c
	$(PYTHON) -m venv $(PYLATE_VENV)
	$(PYLATE_VENV)/bin/python -m pip install -q -U pip
	$(PYLATE_VENV)/bin/python -m pip install -q -e '.[plaid,bench]' $(PYLATE_DEPS)
	$(PYLATE_VENV)/bin/python -m pip install -q --no-deps '$(PYLATE)'
	$(PYLATE_VENV)/bin/python -m pip check | grep -vE '^(No broken requirements found|pylate .* has requirement fast-plaid)' | (! grep .)
	touch $@

.PHONY: setup demo test lint pylate-env
setup: $(VENV)/.installed

pylate-env: $(PYLATE_VENV)/.installed

demo: setup
	$(VENV)/bin/uibk-embed quickstart

lint: setup
	$(VENV)/bin/ruff check .

test: lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup
