"""The code base stays ruff-clean and mypy-clean (the style gates run with the tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    ruff = Path(sys.executable).parent / "ruff"
    proc = subprocess.run([str(ruff), "check", "certify", "tests", "benchmarks", "scripts"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_clean():
    """certify/ type-checks under the [tool.mypy] settings in pyproject.toml."""
    mypy = Path(sys.executable).parent / "mypy"
    proc = subprocess.run([str(mypy)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
