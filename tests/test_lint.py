"""The linter, as part of the tests: `ruff check` with pyproject.toml's [tool.ruff] (lines of at most 120 columns,
pyflakes), so that `make test` fails on a long line or an unused import in the package."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_passes_ruff():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: `make setup` installs the dev extras (pyproject.toml pins it)")
    result = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
