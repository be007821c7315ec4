# Two commands do all the set-up on a fresh machine (Python 3.11 with venv):
#   make demo   creates .venv, installs everything, runs the quick start on the embedded default
#   make test   creates .venv, installs everything, runs ruff and the whole test suite
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip check
	touch $@

.PHONY: setup demo test lint
setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/uibk-embed quickstart

lint: setup
	$(VENV)/bin/ruff check .

test: lint
	$(PY) -m pytest
