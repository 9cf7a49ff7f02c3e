"""Student notebooks read in plain Jupyter: their MyST markdown is rewritten as CommonMark.

One test per construct of :mod:`normcore.classroom.plainmd` on a small index built here, and
one over the student notebook of every chapter: no MyST is left, every exercise's label is
still visible, and a CommonMark renderer (markdown-it, as Jupyter's) shows no raw MyST.
"""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import nbformat
import pytest
from markdown_it import MarkdownIt

from normcore.classroom import read_exercises
from normcore.classroom.__main__ import main
from normcore.classroom.plainmd import (BookIndex, Target, book_index, myst_left,
                                        read_bibliography, to_plain)
from normcore.classroom.student import MystLeftWarning, student_notebook, write_student
from normcore.exercises.credit import describe

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9]*.ipynb"))


@pytest.fixture(scope="module")
def index():
    return BookIndex(
        targets={"sec-a": Target("01_a", "One formula, four sets", "section"),
                 "sec-b": Target("02_b", "Small batches", "section"),
                 "fig-a": Target("01_a", "a caption", "figure", "1.2"),
                 "ema": Target("02_b", "", "equation", "2.1"),
                 "ex-b": Target("02_b", "", "exercise", "2.3")},
        titles={"01_a": "Why normalize", "02_b": "Batch Normalization", "notes": "Notes"},
        files={"01_a": "01_a.ipynb", "02_b": "02_b.ipynb", "notes": "notes.md"},
        citations={"wu2018group": ("Wu and He", "2018"), "ba2016layer": ("Ba et al.", "2016")})


def plain(text, index, chapter="02_b", notes=None):
    out, unknown = to_plain(text, index, chapter, notes)
    assert not unknown, unknown
    return out


# =======================================================================================
# one construct at a time
# =======================================================================================
def test_exercise_fence(index):
    text = "````{exercise} The forward pass\n:label: ex-b\n\nWrite `f`.\n````"
    assert plain(text, index, notes={"ex-b": ", 2 points"}) == (
        "**Exercise 2.3: The forward pass** (`ex-b`, 2 points)\n\nWrite `f`.")
    # no title, a label the index does not number: the label alone, still quotable
    assert plain("````{exercise}\n:label: ex-new\n\nBody.\n````", index) == (
        "**Exercise** (`ex-new`)\n\nBody.")


def test_admonitions(index):
    text = ("````{admonition} A common error: {cite:t}`wu2018group`\n:class: caution\n"
            ":name: err-a\n\nLine one,\n\nline two.\n````")
    assert plain(text, index) == ("> **A common error: Wu and He (2018)**\n>\n> Line one,\n>\n"
                                  "> line two.")
    assert plain("```{note}\nKeep *this*.\n```", index) == "> **Note**\n>\n> Keep *this*."
    assert plain(":::{warning}\nCareful.\n:::", index) == "> **Warning**\n>\n> Careful."


def test_ref_with_and_without_text(index):
    assert plain("See {ref}`sec-a`.", index) == (
        "See [One formula, four sets](01_a.ipynb).")      # another chapter: a link
    assert plain("See {ref}`the noise <sec-b>`.", index) == "See the noise."  # this chapter
    assert plain("In {ref}`ex-b`.", index) == "In Exercise 2.3."


def test_numref_and_eq(index):
    assert plain("{numref}`fig-a` draws it.", index) == "[Fig. 1.2](01_a.ipynb) draws it."
    assert plain("{numref}`Figure %s <fig-a>`", index) == "[Figure 1.2](01_a.ipynb)"
    assert plain("Unrolling {eq}`ema`.", index) == "Unrolling (2.1)."


def test_doc(index):
    assert plain("{doc}`01_a` ended.", index) == "[Why normalize](01_a.ipynb) ended."
    assert plain("{doc}`this one <01_a>`", index) == "[this one](01_a.ipynb)"
    assert plain("{doc}`notes`", index) == "[Notes](notes.md)"


def test_cite_and_cite_t(index):
    assert plain("GN {cite}`wu2018group`.", index) == "GN (Wu and He, 2018)."
    assert plain("{cite}`wu2018group,ba2016layer`", index) == (
        "(Wu and He, 2018; Ba et al., 2016)")
    assert plain("as {cite:t}`ba2016layer` show", index) == "as Ba et al. (2016) show"


def test_target_lines_are_removed(index):
    assert plain("(sec-a)=\n## One formula\n\nText.", index) == "## One formula\n\nText."
    assert plain("Text.\n\n(sec-b)=\n\n## Small", index) == "Text.\n\n## Small"


def test_math(index):
    assert plain("$$\nx = 1\n$$ (ema)\n\nand $y$.", index) == (
        "$$\nx = 1\n\\tag{2.1}\n$$\n\nand $y$.")
    assert plain("```{math}\n:label: ema\nx = 1\n```", index) == "$$\nx = 1\n\\tag{2.1}\n$$"
    assert plain("$$\na\n$$", index) == "$$\na\n$$"    # plain $$ math stays as it is
    assert plain("{math}`x^2`", index) == "$x^2$"


def test_links_to_the_api_reference_become_their_code(index):
    # the reference is the book's, not the notebook's: the link's text stays, as code
    assert plain("See [`F.rms_norm`](#normcore.functional.rms_norm) and "
                 "{py:class}`nnc.DyT <normcore.nn.DyT>`.", index) == (
        "See `F.rms_norm` and `nnc.DyT`.")
    assert plain("A [link](https://example.org).", index) == "A [link](https://example.org)."


def test_code_blocks_and_code_spans_are_left_alone(index):
    text = "```python\nf'{cite}`x`'\n```\n\nThe role `{ref}` and ``{doc}`x` ``."
    assert plain(text, index) == text


def test_unknown_constructs_are_left_and_reported(index):
    text = "````{margin}\nSide.\n````\n\n{ref}`no-such-label` and {abbr}`x`"
    out, unknown = to_plain(text, index, "02_b")
    assert out == text
    assert unknown == ["directive {margin}", "{ref}`no-such-label`", "{abbr}`x`"]
    assert len(myst_left(out)) == 3


def test_myst_left_finds_each_construct():
    for text in ("````{exercise}", ":::{note}", "a {ref}`x` b", "(sec-a)=", "$$ (eq)"):
        assert myst_left(text), text
    assert not myst_left("**Exercise 2.3** (`ex-b`)\n\n> **Note**\n\n$$\nx\n$$\n\n(a)")


def test_bibliography_authors():
    cited = read_bibliography(ROOT / "assets" / "references.bib")
    assert cited["ioffe2015batch"] == ("Ioffe and Szegedy", "2015")
    assert cited["ioffe2017batch"] == ("Ioffe", "2017")
    assert cited["lecun1998efficient"] == ("LeCun et al.", "1998")


def test_book_index_refuses_a_missing_folder(tmp_path):
    with pytest.raises(ValueError, match="not a folder of chapters"):
        book_index(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="no such bibliography"):
        book_index(ROOT / "chapters", tmp_path / "missing.bib")


def test_unknown_myst_warns_when_a_student_notebook_is_written(index):
    md = nbformat.v4.new_markdown_cell
    nb = nbformat.v4.new_notebook(cells=[md("# T"), md("{ref}`no-such-label`")])
    with pytest.warns(MystLeftWarning, match="no-such-label"):
        student_notebook(nb, "t", index)


# =======================================================================================
# every chapter's student notebook
# =======================================================================================
@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("class")
    with warnings.catch_warnings():
        warnings.simplefilter("error", MystLeftWarning)   # nothing unknown in the chapters
        assert main(["student", *map(str, CHAPTERS), "-o", str(out)]) == 0
    return {p.stem: nbformat.read(out / p.name, as_version=4) for p in CHAPTERS}


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_student_notebook_has_no_myst_and_every_label(path, written):
    student = written[path.stem]
    markdown = [c.source for c in student.cells if c.cell_type == "markdown"]
    left = {m for text in markdown for m in myst_left(text)}
    assert not left, f"{path.name}: MyST left in the student notebook: {left}"
    number = int(path.stem[:2])
    for k, ex in enumerate(read_exercises(nbformat.read(path, as_version=4)), 1):
        statement = next(c.source for c in student.cells
                         if c.metadata.get("nbgrader", {}).get("grade_id")
                         == f"{ex.label}-statement")
        # the points, how the rubric splits them (ex-bn-forward: "2 points: 1 for the set,
        # 1 for the variance, eps and the affine map"), and the answer in words' points
        points = re.escape(describe(ex.grading, ex.points, ex.op))
        written = f" \\+ {ex.written} for the answer in words" if ex.written else ""
        assert re.match(rf"\*\*Exercise {number}\.{k}\b.*\*\* \(`{ex.label}`, {points}"
                        rf"{written}\)", statement), statement[:160]


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_commonmark_renders_no_raw_myst(path, written):
    """What a CommonMark renderer without MyST (Jupyter's, markdown-it here) shows as text."""
    md = MarkdownIt("commonmark")
    for cell in written[path.stem].cells:
        if cell.cell_type != "markdown":
            continue
        html = md.render(cell.source)
        text = re.sub(r"<code>.*?</code>", "", html, flags=re.S)   # code is shown as code
        for raw in ("{exercise}", "{admonition}", "{note}", ":label:", ":class:", ":name:",
                    "{ref}", "{doc}", "{cite", "{numref}", "{eq}", ")=\n"):
            assert raw not in text, (path.name, raw, cell.source[:200])
        assert "<pre><code class=\"language-{" not in html, (path.name, cell.source[:200])


def test_myst_option_keeps_the_chapters_markdown(tmp_path):
    path = ROOT / "chapters" / "02_batch_norm.ipynb"
    student = nbformat.read(write_student(path, tmp_path, myst=True), as_version=4)
    text = "\n".join(c.source for c in student.cells if c.cell_type == "markdown")
    assert "````{exercise}" in text and ":label: ex-bn-forward" in text
    assert main(["student", str(path), "--myst", "-o", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / path.name).read_text() == (tmp_path / path.name).read_text()


def test_the_book_numbers_as_the_site():
    """The numbers the built site shows: chapter 3's first labelled equation is (3.1), the
    four sets are chapter 1's second figure, the forward pass is exercise 2.1."""
    index = book_index(ROOT / "chapters")
    assert index.targets["ema"].number == "3.1" and index.targets["ema-unrolled"].number == "3.2"
    assert index.targets["fig-four-sets"].number == "1.2"
    assert index.targets["ex-bn-forward"].number == "2.1"
    assert index.titles["06_group_norm"] == "Group Normalization"
    assert index.citations["wu2018group"] == ("Wu and He", "2018")
