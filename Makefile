# The two commands of the README's Quick start are `make run` and `make test`; both install what
# they need on a fresh machine (a virtualenv, the Go-built control plane, kubectl and helm).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: install tools run test unit lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,lint]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

tools: install
	$(BIN)/python -m machine_preservation.cluster.toolchain

run: tools
	$(BIN)/machine-preservation playground

test: tools lint
	$(BIN)/pytest

unit: install
	$(BIN)/pytest -m 'not integration'

lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .local
