# The two commands (see README.md): `make train` runs the main job, `make test` the tests.
# Each creates the virtual environment it needs on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RAY_STAMP := $(VENV)/.installed-ray

.PHONY: train test replay evaluate serve bench lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch is pinned to the CPU build on disk; see pyproject.toml
	$(PY) -m pip install --quiet -e ".[train,dev]"
	touch $(STAMP)

# the tests also run the Ray smoke tests on a local Ray: the optional `ray` extra, which `make
# train` does not need
$(RAY_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[train,ray,dev]"
	touch $(RAY_STAMP)

train: $(STAMP)
	$(PY) train.py --preset default

test: $(RAY_STAMP)
	$(PY) -m pytest -q

replay: $(STAMP)
	$(PY) scripts/replay.py --trace synthetic

evaluate: $(STAMP)
	$(PY) -m agents.evaluate --trace azure-conv,azure-code --split eval

serve: $(STAMP)
	$(PY) -m runtime.server

bench: $(STAMP)
	$(PY) scripts/bench_engine.py && $(PY) scripts/bench_env.py && $(PY) scripts/bench_decider.py

lint: $(STAMP)
	$(PY) -m ruff check runtime env agents scripts tests train.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
