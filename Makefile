# The two commands of the README's Quick start are `make run` and `make test`; both install what
# they need on a fresh machine (a virtualenv, the Go-built control plane, kubectl and helm).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | sha256sum | cut -c1-12)

.PHONY: install tools run test unit lint lock clean

# The project installs editable (production components only); the developer tools join the same
# `machine_preservation` namespace through a .pth file naming their folders.
DEV_FOLDERS := localcluster playground
# Every folder with Python in it, for ruff.
PYTHON_FOLDERS := cli core kube certs webhook controller $(DEV_FOLDERS) tests benchmarks

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,lint]'
	$(BIN)/python -c "import pathlib, site, sys; pathlib.Path(site.getsitepackages()[0], 'machine_preservation_dev.pth').write_text(''.join(str(pathlib.Path(f).resolve()) + chr(10) for f in sys.argv[1:]))" $(DEV_FOLDERS)
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

tools: install
	$(BIN)/python -m machine_preservation.localcluster.toolchain

run: tools
	$(BIN)/python -m machine_preservation.playground

# Two pytest processes at once: the end-to-end suite (it mostly waits on real MCM's timers) beside all other tests.
# The others print as they go; the end-to-end suite's output follows when both are done. Each starts its own
# control planes, so they share nothing but the machine.
TEST_LOGS := .local/test-logs

test: tools lint
	@mkdir -p $(TEST_LOGS)
	@$(BIN)/pytest tests/e2e > $(TEST_LOGS)/e2e.log 2>&1 & e2e=$$!; \
	$(BIN)/pytest --ignore=tests/e2e; rest=$$?; \
	wait $$e2e; e2e_status=$$?; \
	echo "=== the end-to-end suite (tests/e2e), run alongside ==="; cat $(TEST_LOGS)/e2e.log; \
	test $$rest -eq 0 -a $$e2e_status -eq 0

unit: install
	$(BIN)/pytest -m 'not integration'

lint: install
	$(BIN)/ruff check $(PYTHON_FOLDERS)
	$(BIN)/ruff format --check $(PYTHON_FOLDERS)
	$(BIN)/mypy
	$(BIN)/lint-imports

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
