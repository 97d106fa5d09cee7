# The two commands of the README's Quick start are `make run` and `make test`; both install what
# they need on a fresh machine (a virtualenv, the Go-built control plane, kubectl and helm).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: install tools run test unit lint lock clean

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

# The image's third-party packages with exact versions and hashes: requirements.lock (runtime, from
# pyproject.toml) and requirements-build.lock (pyproject.toml's build-system.requires). uv is a dev-only tool,
# pinned, in a virtualenv of its own; --universal keeps the lock valid on every platform and Python >= 3.11.
UV_VERSION := 0.13.9
LOCK_TOOLS := .local/lock-tools
# Existing pins are kept; `make lock LOCK_FLAGS=--upgrade` moves every package to its newest allowed version.
LOCK_FLAGS ?=
UV_COMPILE := $(LOCK_TOOLS)/bin/uv pip compile $(LOCK_FLAGS) --quiet --universal --generate-hashes --custom-compile-command "make lock"

lock:
	test -x $(LOCK_TOOLS)/bin/uv || $(PYTHON) -m venv $(LOCK_TOOLS)
	$(LOCK_TOOLS)/bin/pip install --quiet uv==$(UV_VERSION)
	$(UV_COMPILE) pyproject.toml -o requirements.lock
	$(PYTHON) -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires'], sep='\n')" \
	  | $(UV_COMPILE) - -o requirements-build.lock

clean:
	rm -rf $(VENV) .local
