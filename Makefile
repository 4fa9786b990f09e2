# Two commands for a newcomer (see README):  make train   |   make test
# Both create .venv first when needed (scripts/setup.sh is idempotent: seconds once done).
PY := .venv/bin/python
ARGS ?=

.PHONY: setup train test test-fast lint clean-venv

setup:
	@bash scripts/setup.sh

train: setup
	$(PY) recipes/train.py $(ARGS)

# The suite CI runs (.ci/run): everything that runs on a 2-core CPU machine; GPU tests skip without CUDA.
# TEST_WORKERS=2 (the default): two pytest-xdist workers, a module (or a UNITS entry of tests/conftest.py) per unit
# of work, the heaviest first; TEST_WORKERS=0: one process (docs/testing.md has both times). ARGS="--shuffle=7":
# another order.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)
test: setup
	$(PY) -m pytest -q $(XDIST) $(ARGS)

# The quick loop while developing: skips tests marked slow.
test-fast: setup
	$(PY) -m pytest -q -m "not slow" $(XDIST) $(ARGS)

lint: setup
	$(PY) -m ruff check nemo_hacpo recipes tests benchmarks

clean-venv:
	rm -rf .venv
