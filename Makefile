# The two commands (see README.md): `make train` runs the main job, `make test` the tests.
# Each creates the virtual environment it needs on first use: .venv holds everything
# (`.[cpu,train,dev]`), .venv-runtime the runtime alone (`.[cpu,dev]`: no torch, gymnasium, SB3),
# where the runtime's tests run a second time to show that they need nothing more.
PYTHON ?= python3
VENV ?= .venv
RUNTIME_VENV ?= .venv-runtime
PY := $(VENV)/bin/python
RPY := $(RUNTIME_VENV)/bin/python
STAMP := $(VENV)/.installed
RSTAMP := $(RUNTIME_VENV)/.installed
RAY_STAMP := $(VENV)/.installed-ray

.PHONY: train test test-runtime typecheck replay evaluate serve bench lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch is pinned to the CPU build on disk; see pyproject.toml
	$(PY) -m pip install --quiet -e ".[cpu,train,dev]"
	touch $(STAMP)

$(RSTAMP): pyproject.toml
	$(PYTHON) -m venv $(RUNTIME_VENV)
	$(RPY) -m pip install --quiet --upgrade pip
	$(RPY) -m pip install --quiet -e ".[cpu,dev]"
	touch $(RSTAMP)

# the tests also run the Ray smoke tests on a local Ray: the optional `ray` extra, which `make
# train` does not need
$(RAY_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[cpu,train,ray,dev]"
	touch $(RAY_STAMP)

train: $(STAMP)
	$(PY) train.py --preset default

test: $(RAY_STAMP) typecheck test-runtime
	$(PY) -m pytest -q

test-runtime: $(RSTAMP)
	$(RPY) -m pytest -q -m "not slow"

typecheck: $(STAMP)
	$(PY) -m mypy

replay: $(STAMP)
	$(VENV)/bin/batchpilot replay --trace synthetic

evaluate: $(STAMP)
	$(VENV)/bin/batchpilot evaluate --trace azure-conv,azure-code --split eval

serve: $(STAMP)
	$(VENV)/bin/batchpilot serve

bench: $(STAMP)
	$(VENV)/bin/batchpilot bench engine && $(VENV)/bin/batchpilot bench env && \
		$(VENV)/bin/batchpilot bench decider

lint: $(STAMP)
	$(PY) -m ruff check runtime env agents scripts tests train.py

clean:
	rm -rf $(VENV) $(RUNTIME_VENV) .pytest_cache .hypothesis .mypy_cache
