"""Lint and types, run by `make test`: ruff on the whole repository and mypy on the files its
configuration names, both configured in pyproject.toml and pinned in requirements.txt.

A failure prints the tool's own report (file:line, rule, message).  `ruff check --fix` fixes
part of what ruff finds; a `# noqa: RULE` that stays names its rule and, in a short comment,
why.  mypy checks the public API (normcore.functional, normcore.nn) and the layers below it
with every def annotated; its cache is .mypy_cache/ (a second run takes a second or two).

Not run: `ruff format --check`.  The project does not use the formatter: its code aligns
continuation lines under the opening bracket and comments in columns, which the formatter
rewrites (it would change almost every file).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """``python -m <tool> args`` in the repository's root, with the venv's interpreter."""
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_ruff_reads_the_projects_own_configuration():
    """Every setting comes from pyproject.toml: no ruff.toml of the repository's or of the
    user's (~/.config/ruff) is in play, so the result is the same on every machine."""
    done = _run("ruff", "check", "--show-settings", "normcore/axes.py", timeout=60)
    assert done.returncode == 0, done.stderr
    assert f'Settings path: "{ROOT / "pyproject.toml"}"' in done.stdout, done.stdout[:400]
    # the rule set is the project's (select = [...]), not the defaults of this ruff version
    assert "bugbear" in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def test_ruff_check_is_clean():
    done = _run("ruff", "check", "--output-format", "concise", "--no-fix", ".", timeout=120)
    if done.returncode != 0:
        pytest.fail(f"ruff check found problems (fix them; `ruff check --fix` does part):\n"
                    f"{done.stdout}{done.stderr}", pytrace=False)


def test_mypy_is_clean():
    done = _run("mypy", "--no-error-summary", timeout=600)
    if done.returncode != 0:
        pytest.fail(f"mypy (the files of [tool.mypy] in pyproject.toml) found problems:\n"
                    f"{done.stdout}{done.stderr}", pytrace=False)
