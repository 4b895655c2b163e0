# felixpy — the two commands the README promises:
#   make demo   a demo node in sandbox network namespaces, fed by the bundled scenario
#   make test   unit + kernel + FV tests (all inside throwaway network namespaces)
# Both install what they need first (apt packages, venv, bcc headers, generated proto).

PYTHON ?= .venv/bin/python
PYTEST ?= .venv/bin/pytest
PYTEST_ARGS ?=

.PHONY: setup proto test unit typecheck demo bench chaos clean

setup:
	@bash scripts/setup.sh

proto:
	@PYTHON=$(PYTHON) bash scripts/gen-proto.sh

test: setup
	@bash scripts/run-tests.sh $(PYTEST_ARGS)

unit: setup
	$(PYTEST) -q tests -m "not kernel and not fv and not bpf" $(PYTEST_ARGS)

# mypy --strict over the felixpy package ([tool.mypy] in pyproject.toml).
typecheck: setup
	$(PYTHON) -m mypy

demo: setup
	$(PYTHON) -m felixpy demo

bench: setup
	$(PYTHON) bench/run_all.py

# The full kill -9 trials (fv/chaos; CI runs 2 per mode at 100 endpoints): results go in docs/reliability.md.
CHAOS_TRIALS ?= 50
CHAOS_ENDPOINTS ?= 300
CHAOS_SEED ?= 1414
chaos: setup
	CHAOS_TRIALS=$(CHAOS_TRIALS) CHAOS_ENDPOINTS=$(CHAOS_ENDPOINTS) CHAOS_SEED=$(CHAOS_SEED) \
		$(PYTEST) -q -s -p no:cacheprovider fv/chaos $(PYTEST_ARGS)

clean:
	rm -rf .venv .pytest_cache .hypothesis felixpy/proto/*_pb2*.py felixpy/proto/*_pb2*.pyi
