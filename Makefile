# Two commands on a fresh machine:
#   make demo   # venv + install + pretrain a tiny MAE-LM on CPython's bundled docs
#   make test   # venv + install with test extras + the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORKDIR ?= workdirs/demo
PYTEST_ARGS ?=

.PHONY: demo test install install-test bench clean

$(VENV)/bin/activate:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed: $(VENV)/bin/activate setup.py
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: install
	$(PY) -m maelm_jax.main --config=configs/demo.py --workdir=$(WORKDIR)

test: install-test
	$(PY) -m pytest -n 2 -q $(PYTEST_ARGS)

bench: install
	$(PY) benchmarks/train_throughput.py

clean:
	rm -rf $(VENV) workdirs
