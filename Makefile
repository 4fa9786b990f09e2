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
test: setup
	$(PY) -m pytest -q $(ARGS)

# The quick loop while developing: skips tests marked slow.
test-fast: setup
	$(PY) -m pytest -q -m "not slow" $(ARGS)

lint: setup
	$(PY) -m ruff check nemo_hacpo recipes tests benchmarks

clean-venv:
	rm -rf .venv
