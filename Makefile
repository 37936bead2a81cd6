PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: venv demo test lint bench-deps bench bench-quick clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(VENV)/bin/superopt demo

test: venv
	$(PY) -m pytest -n 2 tests

lint: venv
	$(VENV)/bin/ruff check superopt search costmodel rewrite_rules tests benchmarks

bench-deps: venv
	$(PY) -m pip install -q -e '.[dev,bench]'

bench-quick: bench-deps
	$(PY) benchmarks/run.py --quick

bench: bench-deps
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) build *.egg-info
