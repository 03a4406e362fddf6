# Two commands on a fresh machine:
#   make demo   # venv + install + pretrain a tiny MAE-LM on CPython's bundled docs
#   make test   # venv + install with test extras + the test suite
#   make test-quick   # the tests not marked slow: minutes, for every edit
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORKDIR ?= workdirs/demo
PYTEST_ARGS ?=

.PHONY: demo test test-quick install install-test bench clean

$(VENV)/bin/activate:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed: $(VENV)/bin/activate setup.py
	$(PY) -m pip install -q -e .
	touch $@

# (One pip run, not `install`'s and then the extras': the test environment has
# the package too.)
$(VENV)/.installed-test: $(VENV)/bin/activate setup.py
	$(PY) -m pip install -q -e '.[test]'
	touch $(VENV)/.installed $@

# Exports must load in the transformers users install today (5.x, no Flax models)
# as well as in 4.57 (the test venv's pin): a second environment, no JAX in it,
# that tests/test_export_hf.py drives through tests/transformers5_check.py.
TRANSFORMERS5 := $(VENV)/transformers5
$(TRANSFORMERS5)/.installed: $(VENV)/bin/activate
	$(PYTHON) -m venv $(TRANSFORMERS5)
	$(TRANSFORMERS5)/bin/python -m pip install -q torch==2.13.0 'transformers>=5,<6' safetensors tokenizers numpy
	touch $@

install: $(VENV)/.installed
# The two environments install side by side: each pip keeps one core busy
# (a fresh clone's `make install-test` 95-101 s against 125-157 s one after the
# other; benchmarks/test-suite-cost.md). `-q` first: nothing said when both are
# up to date.
TEST_ENVS := $(VENV)/.installed-test $(TRANSFORMERS5)/.installed
install-test:
	@$(MAKE) --no-print-directory -q $(TEST_ENVS) || $(MAKE) --no-print-directory -j2 $(TEST_ENVS)

demo: install
	$(PY) -m maelm_jax.main --config=configs/demo.py --workdir=$(WORKDIR)

# Three workers on two cores: two left the cores idle a quarter of the time, while
# a worker waited on a run it started, a bucket or a signal (benchmarks/test-suite-cost.md).
# Tests of a file run on one worker (--dist loadfile), so a module's fixtures (a
# trained run, an export) are built once, not once per worker; the files go out
# in tests/conftest.py's order (FIRST_FILES, then xdist's own: most tests first).
PYTEST := MAELM_TRANSFORMERS5_PYTHON=$(abspath $(TRANSFORMERS5))/bin/python $(PY) -m pytest -n 3 --dist loadfile --no-loadscope-reorder -q --durations=15
test: install-test
	$(PYTEST) $(PYTEST_ARGS)

test-quick: install-test
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

bench: install
	$(PY) benchmarks/train_throughput.py

clean:
	rm -rf $(VENV) workdirs
