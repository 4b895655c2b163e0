# felixpy — the two commands the README promises:
#   make demo   a demo node in sandbox network namespaces, fed by the bundled scenario
#   make test   unit + kernel + FV tests (all inside throwaway network namespaces)
# Both install what they need first (apt packages, venv, bcc headers, generated proto).

PYTHON ?= .venv/bin/python
PYTEST ?= .venv/bin/pytest
PYTEST_ARGS ?=

.PHONY: setup proto test unit typecheck demo bench chaos clean image image-test config-doc

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

# docs/config.md from the Config class (tests/test_configdoc.py fails when it is stale).
config-doc: setup
	$(PYTHON) -m felixpy.configdoc

demo: setup
	$(PYTHON) -m felixpy demo

bench: setup
	$(PYTHON) bench/run_all.py

# The node image without Docker Hub: build/image/felixpy-image.tar (oci-archive); docs/deploy.md.
image: setup
	@PYTHON=$(PYTHON) bash scripts/build-image.sh

# Smoke test of the built image: its rootfs runs the daemon in a throwaway network namespace.
image-test: setup
	@PYTEST=$(PYTEST) bash scripts/image-test.sh $(PYTEST_ARGS)

# The full chaos trials (fv/chaos: kill -9, restart into another world, drift; CI runs 2 kill -9 trials per
# mode at 100 endpoints): results go in docs/reliability.md.
CHAOS_TRIALS ?= 50
CHAOS_ENDPOINTS ?= 300
CHAOS_SEED ?= 1414
chaos: setup
	CHAOS_TRIALS=$(CHAOS_TRIALS) CHAOS_ENDPOINTS=$(CHAOS_ENDPOINTS) CHAOS_SEED=$(CHAOS_SEED) \
		$(PYTEST) -q -s -p no:cacheprovider fv/chaos $(PYTEST_ARGS)

clean:
	rm -rf .venv .pytest_cache .hypothesis felixpy/proto/*_pb2*.py felixpy/proto/*_pb2*.pyi
