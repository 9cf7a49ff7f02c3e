"""The book's API reference (chapters/api*.md, Sphinx autodoc + napoleon) and the chapters'
links to it.

Without a build: every public name of normcore.nn and normcore.functional has an entry;
napoleon, configured as _config.yml configures it, turns a docstring of the house form
(docformat: Args with "Default: ...", Shape, Differs from torch, Examples) into those
sections; each chapter's first mention of a public name is a link (tools/api_links.py).
On the built site (marker `site`): each entry's anchor exists, and each chapter's page links
to the entries its prose mentions first.
"""

from __future__ import annotations

import re
import sys
import inspect
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
sys.path.insert(0, str(ROOT / "tools"))

import api_links  # noqa: E402

API_PAGES = sorted((ROOT / "chapters").glob("api*.md"))
CHAPTERS = [p for p in sorted((ROOT / "chapters").glob("*.ipynb"))
            + sorted((ROOT / "chapters").glob("*.md")) if p not in API_PAGES]
_ENTRY = re.compile(r"^\s*\.\. (?:auto(?:class|function|data)|py:data)::\s+(\S+)", re.M)


def documented() -> set[str]:
    """The full names the reference pages document."""
    out = set()
    for page in API_PAGES:
        text = page.read_text(encoding="utf-8")
        module = re.search(r"```\{py:module\} (\S+)", text)
        for name in _ENTRY.findall(text):
            out.add(name if name.startswith("normcore.") else f"{module[1]}.{name}")
    return out


def test_every_public_name_has_an_entry():
    names = {n for n, v in api_links.public_names().items() if v.role != "py:mod"}
    assert API_PAGES, "no chapters/api*.md"
    missing, extra = names - documented(), documented() - names
    assert not missing, f"public names without an entry in chapters/api*.md: {sorted(missing)}"
    assert not extra, f"entries in chapters/api*.md that are not public names: {sorted(extra)}"


def test_api_pages_are_in_the_toc():
    toc = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    for page in API_PAGES:
        assert f"file: chapters/{page.stem}\n" in toc, f"{page.name} is not in _toc.yml"


# --- napoleon, as _config.yml sets it up ----------------------------------------------------

HOUSE_FORM = r'''One sentence: batch normalization over a 4-D input.

    A paragraph with math :math:`\mu_i`:

    .. math::

        y = \frac{x - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}} \, \gamma + \beta

    Args:
        num_features (int): :math:`C`, the number of channels.
        eps (float): added to the variance under the square root. Default: ``1e-5``

    Shape:
        - Input: :math:`(N, C, H, W)`
        - Output: :math:`(N, C, H, W)` (same shape as input)

    Differs from torch:
        ``eps <= 0`` raises a ``ValueError``.

    Examples:
        >>> m = BatchNorm2d(3)
        >>> m(torch.randn(8, 3, 5, 5)).shape
        torch.Size([8, 3, 5, 5])
    '''


def napoleon_config():
    from sphinx.ext.napoleon import Config

    conf = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["sphinx"]
    assert "sphinx.ext.napoleon" in conf["config"]["extensions"]
    return Config(**{k: v for k, v in conf["config"].items() if k.startswith("napoleon_")})


def rendered(doc: str) -> str:
    from sphinx.ext.napoleon.docstring import GoogleDocstring

    return str(GoogleDocstring(inspect.cleandoc(doc), napoleon_config(), what="class"))


def test_napoleon_renders_the_house_sections():
    rst = rendered(HOUSE_FORM)
    assert ":param num_features: :math:`C`, the number of channels." in rst
    assert ":type num_features: int" in rst
    assert "Default: ``1e-5``" in rst, "the Args entry's 'Default: ...' is kept as written"
    for section in ("Shape", "Differs from torch", "Examples"):
        assert f".. rubric:: {section}" in rst, f"no {section!r} section:\n{rst}"
    shape = rst.split(".. rubric:: Shape", 1)[1].split(".. rubric::", 1)[0]
    assert "- Input: :math:`(N, C, H, W)`" in shape, shape
    assert ">>> m = BatchNorm2d(3)" in rst


def test_without_the_custom_sections_shape_is_lost():
    """The test above can fail: without napoleon_custom_sections, "Shape:" is plain text."""
    from sphinx.ext.napoleon import Config
    from sphinx.ext.napoleon.docstring import GoogleDocstring

    rst = str(GoogleDocstring(inspect.cleandoc(HOUSE_FORM), Config(), what="class"))
    assert ".. rubric:: Shape" not in rst


# --- the chapters' links ----------------------------------------------------------------------


def test_each_chapters_first_mention_links_to_the_reference():
    names, torch_names = api_links.public_names(), api_links._torch_names()
    problems = []
    for path in CHAPTERS:
        problems += api_links.process(path, names, torch_names, check=True)
    assert not problems, ("first mentions of normcore names that do not link to the API "
                          "reference (run `python tools/api_links.py chapters/*.ipynb "
                          "chapters/*.md`):\n" + "\n".join(problems))


def _check(text: str, code: str = "import normcore.functional as F\n") -> list[str]:
    names = api_links.public_names()
    resolve = api_links.Resolver(names, api_links.aliases(code), api_links._torch_names())
    problems: list[str] = []
    api_links.link(text, resolve, set(), False, problems)
    return problems


def test_the_link_check_can_fail():
    assert _check("We call `normcore.nn.BatchNorm2d` here.") == [
        "`normcore.nn.BatchNorm2d` (normcore.nn.BatchNorm2d)"]
    assert _check("`F.layer_norm(x, (4,))` computes") == [
        "`F.layer_norm(x, (4,))` (normcore.functional.layer_norm)"]
    assert _check("then `from_torch` swaps") == ["`from_torch` (normcore.nn.from_torch)"]
    # only the first mention must link; a link to the entry, or a py role, is a link
    assert _check("[`F.layer_norm`](#normcore.functional.layer_norm), `F.layer_norm`") == []
    assert _check("{py:func}`F.layer_norm <normcore.functional.layer_norm>`, `F.layer_norm`") == []
    assert _check("`F.layer_norm`, then [`F.layer_norm`](#normcore.functional.layer_norm)") != []
    assert _check("[`F.layer_norm`](#normcore.functional.rms_norm), `F.layer_norm`") != []
    # not mentions: torch's names, an attribute, a bare name torch has too, code blocks,
    # a link's text, and F without a chapter that imports normcore.functional as F
    assert _check("`torch.nn.BatchNorm2d`, `DyT.alpha`, `BatchNorm2d`, `batch_norm`, "
                  "[`normcore.nn.DyT`](x.html)\n```\nnormcore.nn.LayerNorm\n```\n") == []
    assert _check("`F.layer_norm`", code="import torch.nn.functional as F\n") == []


def test_linking_keeps_the_text_and_is_idempotent():
    names = api_links.public_names()
    resolve = api_links.Resolver(names, {"F": "normcore.functional"}, api_links._torch_names())
    text = "See `normcore.nn.BatchNorm1d / 2d / 3d` and `F.rms_norm(x, (4,))`, then `F.rms_norm`."
    linked = api_links.link(text, resolve, set(), False)
    assert linked == ("See [`normcore.nn.BatchNorm1d / 2d / 3d`](#normcore.nn.BatchNorm1d) "
                      "and [`F.rms_norm(x, (4,))`](#normcore.functional.rms_norm), then "
                      "`F.rms_norm`.")
    assert api_links.link(linked, resolve, set(), False) == linked


# --- the built site ---------------------------------------------------------------------------


def _first_mentions(path: Path) -> set[str]:
    """The full names whose first mention in a chapter is a role (all of them, once linked)."""
    names, torch_names = api_links.public_names(), api_links._torch_names()
    seen: set[str] = set()
    if path.suffix == ".ipynb":
        import nbformat

        nb = nbformat.read(path, as_version=4)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        texts = [c.source for c in nb.cells if c.cell_type == "markdown"
                 and "remove-cell" not in c.metadata.get("tags", [])]
        md = False
    else:
        text = path.read_text(encoding="utf-8")
        code, texts, md = text, [text], True
    resolve = api_links.Resolver(names, api_links.aliases(code), torch_names)
    for text in texts:
        api_links.link(text, resolve, seen, md, problems=[])
    return seen


@pytest.mark.site
def test_built_chapters_link_to_the_entries():
    if not (HTML / "chapters" / "api_nn.html").is_file():
        pytest.fail(f"{HTML} has no API reference: build the book (`make build`)")
    anchors = {}
    for page in API_PAGES:
        html = (HTML / "chapters" / f"{page.stem}.html").read_text(encoding="utf-8")
        for ident in re.findall(r'\bid="((?:module-)?normcore\.[\w.]+)"', html):
            anchors[ident] = page.stem
    names = api_links.public_names()
    ident = {full: ("module-" if v.role == "py:mod" else "") + full for full, v in names.items()}
    missing = sorted(full for full in names if ident[full] not in anchors)
    assert not missing, f"public names without an anchor in the built reference: {missing}"
    problems = []
    for path in CHAPTERS:
        html = (HTML / "chapters" / f"{path.stem}.html").read_text(encoding="utf-8")
        for full in _first_mentions(path):
            href = f'href="{anchors[ident[full]]}.html#{ident[full]}"'
            if href not in html:
                problems.append(f"{path.stem}.html has no link {href}")
    assert not problems, "\n".join(problems)


# --- assets/sphinx_ext/normcore_api.py --------------------------------------------------------

sys.path.insert(0, str(ROOT / "assets" / "sphinx_ext"))
import normcore_api  # noqa: E402


def test_bases_line_names_the_torch_class():
    import torch

    import normcore.nn as nnc

    assert normcore_api.torch_bases(nnc.BatchNorm2d) == [":py:class:`torch.nn.BatchNorm2d`"]
    assert normcore_api.torch_bases(nnc.WSConv2d) == [":py:class:`torch.nn.Conv2d`"]
    assert normcore_api.torch_bases(nnc.DyT) == [":py:class:`torch.nn.Module`"]
    assert normcore_api.public_name(torch.nn.modules.batchnorm.SyncBatchNorm) == \
        "torch.nn.SyncBatchNorm"


def test_a_paragraph_after_a_list_gets_its_blank_line():
    lines = [".. rubric:: Differs from torch", "", "- one", "  more of one", "- two",
             "See the page.", "", ":param x: a", "", "- a", ":param y: b"]
    assert normcore_api.separate_lists(lines) == [
        ".. rubric:: Differs from torch", "", "- one", "  more of one", "- two", "",
        "See the page.", "", ":param x: a", "", "- a", "", ":param y: b"]
    # nothing else changes: a list then a blank line, nested items, plain text
    same = ["- a", "  - b", "  - c", "- d", "", "text", "more text"]
    assert normcore_api.separate_lists(same) == same
