"""The code keeps the style the project holds itself to: ruff (lint and format) and mypy
(strict, setup.cfg) are clean over the gateway, its tests and its benchmarks. Part of the suite,
so `.ci/run` enforces them on every change."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_CHECKED = ["gateway", "tests", "bench"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_finds_nothing_to_fix() -> None:
    result = _run("ruff", "check", *_CHECKED)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_would_change_nothing() -> None:
    result = _run("ruff", "format", "--check", *_CHECKED)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean() -> None:
    result = _run("mypy", *_CHECKED)
    assert result.returncode == 0, result.stdout + result.stderr
