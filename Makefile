# The two commands of the README:
#   make run    the main job (builds the example kernels, loads them through kerneld_client)
#   make test   lint, type checks and the whole test suite
# Both create or reuse .venv and install what they need (scripts/bootstrap).

VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: run test bootstrap lint typecheck proto proto-check bench clean

bootstrap:
	@scripts/bootstrap

run: bootstrap
	@$(PY) -m examples.main_job

lint: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: bootstrap
	$(VENV)/bin/mypy

proto: bootstrap
	$(PY) scripts/genproto

proto-check: bootstrap
	$(PY) scripts/genproto --check

test: lint typecheck
	$(PY) -m pytest $(PYTEST_ARGS)

bench: bootstrap
	$(PY) -m bench.run

clean:
	rm -rf .cache .pytest_cache .mypy_cache .ruff_cache
