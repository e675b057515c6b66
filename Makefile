# The two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
# Where the CPU build of torch comes from: an *extra* index, so pip prefers 2.13.0+cpu (a local
# version sorts above 2.13.0) over PyPI's CUDA build (+16 nvidia-* packages) on a fresh machine.
# The index is probed once (15 s at most): where it cannot be reached, torch comes from the default
# index straight away, instead of after pip's retry warnings for each of the ten packages torch
# needs; one line says which index was used. An already installed pinned torch asks no index.
# `make TORCH_INDEX=` installs from the default index only.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# The version TORCH_SPEC pins (the whole spec if it pins none: then pip is always asked).
TORCH_PIN = $(patsubst torch==%,%,$(TORCH_SPEC))
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: venv install demo test test-fast test-asan lint bench clean

$(VENV)/.installed: pyproject.toml setup.py $(wildcard native/*.c native/*.h native/internal/*.h native/*.py)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	# torch first and pinned (an unpinned one would pull a multi-GB CUDA build), CPU build by default.
	@if $(PY) -c "import importlib.metadata as m, sys; sys.exit(m.version('torch').split('+')[0] != '$(TORCH_PIN)')" 2>/dev/null; then \
		echo "torch: $(TORCH_SPEC) is installed"; \
	$(if $(TORCH_INDEX),elif $(PY) -c "import socket; socket.setdefaulttimeout(15); import urllib.request as u; u.urlopen('$(TORCH_INDEX)/').close()" 2>/dev/null; then \
		echo "torch: $(TORCH_SPEC) from $(TORCH_INDEX) (then the default index for what it lacks)"; \
		$(PIP) install --extra-index-url $(TORCH_INDEX) --retries 1 "$(TORCH_SPEC)"; \
	)else \
		echo "torch: $(TORCH_SPEC) from the default index$(if $(TORCH_INDEX), ($(TORCH_INDEX) cannot be reached))"; \
		$(PIP) install "$(TORCH_SPEC)"; \
	fi
	$(PIP) install -e ".[test,bench,s3,lightning,hf,plot,triton]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) examples/train_digits.py --workdir demo-run

# The sanitizer run first (short), then the static checks, then the whole suite, whose summary
# closes the output; --durations=25 lists the slowest tests above it, so the suite's cost stays
# visible (docs/development.md: the tiers, and what is slow).
test: install
	$(MAKE) test-asan
	$(MAKE) lint
	$(PY) -m pytest tests --durations=25

# Import contracts (layers, no cycles), ruff and mypy; their settings live in pyproject.toml.
lint: install
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check mvc tests benchmarks examples
	$(VENV)/bin/mypy

# Everything but the `slow` tier (crash, kill and concurrency loops, long corruption sweeps, the
# framework examples): for the edit-test loop, not CI.
test-fast: install
	$(PY) -m pytest tests -m "not slow" -x

# The native coders rebuilt with AddressSanitizer + UBSan, and their tests run under it.
test-asan: install
	bash native/run_sanitized_tests.sh $(PY)

bench: install
	$(PY) benchmarks/bench_e2e.py

clean:
	rm -rf build dist *.egg-info mvc/_mvc_native*.so native/_build demo-run
