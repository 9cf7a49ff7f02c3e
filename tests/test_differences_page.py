"""The page of deliberate differences from PyTorch (chapters/differences.md): its code cells,
which the book runs at build time, run here too, so that a change of behaviour (normcore's or
PyTorch's) breaks a test and not only the next build."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "chapters" / "differences.md"
CELLS = re.findall(r"```\{code-cell\}[^\n]*\n(.*?)```", PAGE.read_text(), re.S)


def test_the_page_has_a_checking_cell_per_section():
    sections = re.findall(r"^## ", PAGE.read_text(), re.M)
    assert len(CELLS) == len(sections) + 1          # the setup cell, then one per section
    assert all("assert" in cell for cell in CELLS[1:])


def test_every_cell_of_the_page_runs():
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        for i, cell in enumerate(CELLS):
            exec(compile(cell, f"{PAGE.name}, cell {i}", "exec"), namespace)
