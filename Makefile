# felixpy — the two commands the README promises:
#   make demo   a demo node in sandbox network namespaces, fed by the bundled scenario
#   make test   unit + kernel + FV tests (all inside throwaway network namespaces)
# Both install what they need first (apt packages, venv, bcc headers, generated proto).

PYTHON ?= .venv/bin/python
PYTEST ?= .venv/bin/pytest
PYTEST_ARGS ?=

.PHONY: setup proto test unit typecheck demo bench chaos fuzz clean image image-test config-doc

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

# The full fv/chaos trials (kill -9, restart into another world, drift, floods, live feed fuzz; CI runs 2 kill -9
# trials per mode at 100 endpoints, a 5 s flood, 40 live fuzz streams), after the long feed fuzz: results go
# in docs/reliability.md.
CHAOS_TRIALS ?= 50
CHAOS_ENDPOINTS ?= 300
CHAOS_SEED ?= 1414
FLOOD_SECONDS ?= 60
FLOOD_RATE ?= 20000
FUZZ_LIVE_EXAMPLES ?= 200
chaos: setup fuzz
	FLOOD_SECONDS=$(FLOOD_SECONDS) FLOOD_RATE=$(FLOOD_RATE) FUZZ_LIVE_EXAMPLES=$(FUZZ_LIVE_EXAMPLES) \
	CHAOS_TRIALS=$(CHAOS_TRIALS) CHAOS_ENDPOINTS=$(CHAOS_ENDPOINTS) CHAOS_SEED=$(CHAOS_SEED) \
		$(PYTEST) -q -s -p no:cacheprovider --timeout 7200 fv/chaos $(PYTEST_ARGS)

# The long feed fuzz (tests/fuzz; CI runs ~3,000 messages per mode, derandomized): >= 100,000 hostile
# messages per *tables mode through the daemon's manager graph over fakes, plus a million-member set.
FUZZ_EXAMPLES ?= 1400
FUZZ_MAX_STREAM ?= 96
FUZZ_SEED ?= 14
fuzz: setup
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_MAX_STREAM=$(FUZZ_MAX_STREAM) FUZZ_SEED=$(FUZZ_SEED) FUZZ_MILLION=1 \
		$(PYTEST) -q -s -p no:cacheprovider --timeout 7200 tests/fuzz $(PYTEST_ARGS)

clean:
	rm -rf .venv .pytest_cache .hypothesis felixpy/proto/*_pb2*.py felixpy/proto/*_pb2*.pyi
