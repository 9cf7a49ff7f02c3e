"""The notation page (chapters/notation.md) and the chapters' math.

The page is generated from chapters/notation.yml by tools/notation.py; every symbol a chapter's
math uses must be defined there, in the table (the whole book) or in the chapter's own list of
symbols that stay inside one argument. The symbol reader is tools/notation.py's.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import notation  # noqa: E402 - importable once sys.path has its folder

DATA = notation.load()


def test_page_is_generated():
    """Nobody edits notation.md by hand: it is what the generator writes."""
    assert notation.PAGE.read_text(encoding="utf-8") == notation.render(DATA), (
        "chapters/notation.md differs from chapters/notation.yml: edit the YAML and run "
        "python tools/notation.py")
    assert notation.main(["--check"]) == 0


def test_check_flag_detects_a_stale_page(tmp_path, monkeypatch):
    page = tmp_path / "notation.md"
    page.write_text(notation.render(DATA) + "\nedited by hand\n", encoding="utf-8")
    monkeypatch.setattr(notation, "PAGE", page)
    assert notation.main(["--check"]) == 1


def test_no_symbol_has_two_meanings():
    """(b) A symbol is in the table once, and a chapter's own symbols are not in the table:
    no exceptions (the data has no list of known double meanings: remove one instead)."""
    assert "collisions" not in sorted(DATA), (
        "notation.yml lists double meanings: remove them instead")
    table = notation.defined(DATA)
    clashes = [f"table: {k} means {' and also '.join(m)}" for k, m in table.items() if len(m) > 1]
    for chapter, symbols in notation.local(DATA).items():
        assert (notation.CHAPTERS / f"{chapter}.ipynb").exists() or \
            (notation.CHAPTERS / f"{chapter}.md").exists(), chapter
        clashes += [f"{chapter}: {k} means {symbols[k]}, and in the table {table[k][0]}"
                    for k in symbols if k in table]
    assert not clashes, "symbols with two meanings:\n" + "\n".join(sorted(clashes))


def test_decided_symbols_are_in_the_table():
    keys = set(notation.defined(DATA))
    for key in ["\\mathcal{L}", "L", "T", "M", "l", "\\mathcal{F}", "\\alpha_{DN}",
                "\\beta_{DN}", "j", "\\mu", "\\sigma", "\\delta", "K", "G", "F", "W", "\\mathbf{W}",
                "\\hat{\\mathbf{W}}", "\\mathbf{W}'", "a", "K_A", "K_B"]:
        assert key in keys, key
    # weights are bold: the plain W is only the width, and no per-channel gain has a letter
    # of its own (it is a_c); \rho is chapter 1's correlation only
    for key in ["\\hat{W}", "W'", "\\rho", "K_a", "K_b"]:
        assert key not in keys, key
    assert "\\rho" in notation.local(DATA)["01_why_normalize"]
    rows = {row["tex"]: row for s in DATA["sections"] for row in s["rows"]}
    assert "04_layer_norm" in rows["$T$"]["first"]


def test_rendered_page_keeps_its_formulas_and_tables():
    page = notation.render(DATA)
    assert page.startswith("(notation)=\n# Notation\n")
    assert page.count("$$") == 4
    for title in ["Tensors, shapes and indices", "The one formula", "Gradients",
                  "Running statistics", "Weights", "Deep stacks"]:
        assert f"## {title}\n\n| symbol | meaning | PyTorch name | first appears |" in page


# ------------------------------------------------------------------ the reader of symbols

OPS = set(DATA["operators"])


def syms(tex: str) -> list[str]:
    return notation.symbols_in(tex, OPS, notation.compounds(DATA))[0]


@pytest.mark.parametrize("tex, expected", [
    (r"\hat x_i = (x_i - \mu_i)\, r_i", [r"\hat{x}", "i", "x", "i", r"\mu", "i", "r", "i"]),
    (r"\mu_{\text{pop}}", [r"\mu_{pop}"]),
    (r"\sigma^2_{\text{pop}}", [r"\sigma_{pop}"]),
    (r"\alpha_{\mathrm{DN}}\, x_l", [r"\alpha_{DN}", "x", "l"]),
    (r"C_\text{out}", ["C_{out}"]),
    (r"\mathrm{E}[x] + E[x] + \operatorname{Var}(x)", ["x", "x", "x"]),
    (r"\sum_{k \in S_i} x_k", ["k", "S", "i", "x", "k"]),
    (r"K_A \mu_A + M_2 + t^\ast + W'", ["K_A", r"\mu_A", "M_2", "t^*", "W'"]),
    (r"\frac{\partial \mathcal{L}}{\partial \hat{\mathbf{W}}_{c,j}}",
     [r"\mathcal{L}", r"\hat{\mathbf{W}}", "c", "j"]),
    (r"\mathbf{W}'_c = \tilde\gamma_c \mathbf W_c, \hat{\mathbf W}' + \mathbf{w}^\ast",
     [r"\mathbf{W}'", "c", r"\tilde{\gamma}", "c", r"\mathbf{W}", "c", r"\hat{\mathbf{W}}'",
      r"\mathbf{w}^*"]),
    (r"\tilde\gamma_c", [r"\tilde{\gamma}", "c"]),
    (r"x_{l+1} = \mathrm{LN}(x_l + \mathcal{F}(x_l))",
     ["x", "l", "x", "l", r"\mathcal{F}", "x", "l"]),
    (r"\text{if } x > 0", ["x"]),
])
def test_symbols_in(tex, expected):
    assert syms(tex) == expected


def test_math_in_markdown_reads_every_form_and_skips_code():
    text = (
        "Inline $x_i$ and `$not math$` and \\$5.\n\n"
        "$$\ny = \\gamma\n$$\n\n"
        "```{math}\n:label: eq\n\\mu = 0\n```\n\n"
        "```python\nz = '$q$'\n```\n\n"
        "````{admonition} A box\n:class: note\n\nInside $\\beta$.\n````\n"
    )
    assert notation.math_in_markdown(text) == ["\\mu = 0", "\\beta", "\ny = \\gamma\n", "x_i"]


def test_checker_reports_exactly_the_undefined_symbol(tmp_path):
    """(d) The check can fail: a copy of a chapter with one fake symbol added reports that
    symbol, with its chapter and context, and nothing it already accepted."""
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    src = notation.CHAPTERS / "03_running_stats.ipynb"
    nb = json.loads(src.read_text(encoding="utf-8"))
    before = notation.check_chapters(DATA, notation.CHAPTERS)
    before = {(v.symbol, v.context) for v in before if v.chapter == "03_running_stats"}
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "id": "fake",
                        "source": ["A defined $\\gamma_c$ and a fake $\\zeta_c + \\mu$."]})
    (chapters / src.name).write_text(json.dumps(nb), encoding="utf-8")
    shutil.copy(notation.CHAPTERS / "notation.md", chapters / "notation.md")
    found = notation.check_chapters(DATA, chapters)
    new = [v for v in found if (v.symbol, v.context) not in before]
    assert [(v.chapter, v.symbol, v.context) for v in new] == [
        ("03_running_stats", "\\zeta", "\\zeta_c + \\mu")]

    synthetic = ("We use $\\hat x_i$, $\\mu_{\\text{pop}}$ and an undefined "
                 "$\\xi + \\mu_{\\text{foo}}$.")
    bad = notation.check_text("intro", synthetic, DATA)
    assert [v.symbol for v in bad] == ["\\xi", "\\mu_{foo}"]


def test_local_symbols_count_in_their_chapter_only():
    text = "The Hessian $Q$ and the step $\\eta$."
    assert notation.check_text("01_why_normalize", text, DATA) == []
    assert [v.symbol for v in notation.check_text("06_group_norm", text, DATA)] == ["Q"]


def test_misuse_of_a_defined_letter_is_reported():
    text = ("$\\partial L/\\partial y_i$ and $\\mathrm{LN}(x_l + G(x_l))$ and "
            "$\\partial \\mathcal{L}$")
    assert [v.symbol.split()[0] for v in notation.check_misuses("x", text, DATA)] == ["L", "G"]


def test_a_plain_W_as_a_weight_is_reported():
    """The plain W is a width; a weight written with it (indexed, scaled, applied, folded) is
    reported; a width, and a bold weight, are not."""
    weights = ["W_c", "W_{c,j}", "aW", "a W_c", "z = Wx + b", "z = xW^\\top", "W'_c"]
    fine = ["(N, C, H, W)", "H \\times W", "s = hW + w", "(N, C, H', W')", "i_W", "NHW",
            "\\mathbf{W}_c", "a\\mathbf{W}", "\\hat{\\mathbf{W}}'", "z = \\mathbf{W}x + b"]
    for tex in weights:
        found = notation.check_misuses("x", f"${tex}$", DATA)
        assert [v.symbol.split()[0] for v in found] == ["W"], tex
    for tex in fine:
        assert notation.check_misuses("x", f"${tex}$", DATA) == [], tex


def test_unknown_operator_word_is_reported():
    assert [v.symbol for v in notation.check_text("intro", "$\\mathrm{Foo}(x)$", DATA)] == [
        "\\mathrm{Foo}"]


# ------------------------------------------------------------------ the chapters

def test_chapters_use_only_defined_symbols():
    """(c) Every symbol in every chapter's math is in the table or in the chapter's list."""
    bad = notation.check_chapters(DATA)
    assert not bad, (f"{len(bad)} uses of symbols notation.yml does not define "
                     "(chapter: symbol  in  context):\n" + "\n".join(map(str, bad)))
