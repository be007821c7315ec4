# Two commands do all the set-up on a fresh machine (Python 3.11 with venv):
#   make demo   creates .venv, installs everything, runs the quick start on the embedded default
#   make test   creates .venv, installs everything, runs ruff and the whole test suite
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
# make test runs the suite in this many pytest-xdist workers (a test module, with its backend spec,
# is one unit of work: tests/conftest.py); TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= 2
# PyLate (the ColBERT head of load_encoder(dense=..., tokens=...)) pins fast-plaid<=1.4.6.2110,
# the plaid extra 1.7.0.2110: its ColBERT model never imports fast-plaid, so pylate goes in
# beside it with --no-deps after its other requirements (pylate 1.6.0's METADATA, less
# fast-plaid); pip check then reports that one known conflict and nothing else may appear.
PYLATE := pylate==1.6.0
PYLATE_DEPS := 'sentence-transformers==5.3.0' 'transformers>=4.41.0,<=5.3.0' 'datasets>=2.20.0' \
	'accelerate>=0.31.0' 'pandas>=2.2.1' 'ujson==5.12.0' 'ninja==1.11.1.4' 'fastkmeans==0.5.0'

# the fused MaxSim kernel is compiled by the editable install: a changed kernel source installs again
$(VENV)/.installed: pyproject.toml src/uibk_embedding/_maxsim_kernel.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[test]' $(PYLATE_DEPS)
	$(PY) -m pip install -q --no-deps '$(PYLATE)'
	$(PY) -m pip check | grep -vE '^(No broken requirements found|pylate .* has requirement fast-plaid)' \
		| (! grep .)
	touch $@

.PHONY: setup demo test lint
setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/uibk-embed quickstart

lint: setup
	$(VENV)/bin/ruff check .

test: lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup
