# The two commands a user needs are `make parity` and `make test`; both bootstrap .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OUT    ?= out/parity
SUITE  ?= default
PYTEST_ARGS ?=

.PHONY: setup test parity clean

setup: $(STAMP)

# Reinstall whenever the pinned dependency list changes.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "mhc-parity needs Python >= 3.11")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: setup
	$(PY) -m pytest -n auto $(PYTEST_ARGS)

parity: setup
	$(PY) -m harness run --suite $(SUITE) --out $(OUT)

clean:
	rm -rf $(VENV) out .cache .pytest_cache
