#!/usr/bin/env bash
# The whole test run, as CI runs it: set-up (scripts/setup.sh --test: what the demo needs plus
# the test extras, Chromium, PostgreSQL, poppler and MLServer), the style gates (ruff, mypy),
# then pytest on two workers (pytest-xdist; tests/conftest.py groups the tests so that each
# module's fixtures, the shared demo run and Ray stay on one worker). Arguments go to pytest,
# e.g. `bash scripts/test.sh -m "not slow"` for the fast tier, `-n 0` for one process. pytest
# runs last, so its summary line closes the output.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
echo "ruff: checking certify tests benchmarks scripts"
.venv/bin/ruff check certify tests benchmarks scripts
echo "mypy: checking certify (pyproject.toml [tool.mypy])"
.venv/bin/mypy
exec .venv/bin/python -m pytest -n 2 --dist loadgroup "$@"
