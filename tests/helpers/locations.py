"""Where things are, for tests in any folder: workers launched by path, fixtures, the checkout."""
from __future__ import annotations

from pathlib import Path

#: This folder: shared helper modules and the worker scripts tests start as subprocesses.
HELPERS = Path(__file__).resolve().parent
TESTS = HELPERS.parent
#: The checked-in data tests read (the repository an earlier mvc wrote).
FIXTURES = TESTS / "fixtures"
#: The project's checkout: docs/, examples/, benchmarks/, the Makefile.
ROOT = TESTS.parent
