# The two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: venv install demo test test-fast test-asan lint bench clean

$(VENV)/.installed: pyproject.toml setup.py $(wildcard native/*.c native/*.h native/internal/*.h native/*.py)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[test,bench,s3,lightning,hf]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) examples/train_digits.py --workdir demo-run

# The sanitizer run first (short), then the static checks, then the whole suite, whose summary
# closes the output.
test: install
	$(MAKE) test-asan
	$(MAKE) lint
	$(PY) -m pytest tests

# Import contracts (layers, no cycles), ruff and mypy; their settings live in pyproject.toml.
lint: install
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check mvc tests benchmarks examples
	$(VENV)/bin/mypy

test-fast: install
	$(PY) -m pytest tests -m "not slow" -x

# The native coders rebuilt with AddressSanitizer + UBSan, and their tests run under it.
test-asan: install
	bash native/run_sanitized_tests.sh $(PY)

bench: install
	$(PY) benchmarks/bench_e2e.py

clean:
	rm -rf build dist *.egg-info mvc/_mvc_native*.so native/_build demo-run
