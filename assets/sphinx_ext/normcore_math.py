"""Typeset the book's math at build time: pages carry their math as HTML and load no MathJax.

A Sphinx extension (``_config.yml``: ``sphinx.local_extensions`` and ``extensions``). It
registers the math renderer ``normcore_mathjax``, which writes the same markup as Sphinx's
``mathjax`` renderer (``<span class="math">\\(...\\)</span>``, ``<div class="math">\\[...\\]
</div>``, as myst-parser adjusts it) but adds no MathJax script to the page. When the build
has finished, every page in the output with math is typeset by MathJax 3 itself, in node
(``mathjax_prerender.js``, the ``mathjax`` npm package pinned in package.json):

- the ``.math`` elements, and the math in widget captions (the ``HTMLMathModel`` values in
  the page's embedded widget state, which ipywidgets typesets in the browser only when a
  ``window.MathJax`` exists: with none, the prerendered caption is shown as it is);
- output: MathJax's CommonHTML, with the assistive MathML that screen readers read; the
  page gets the CHTML stylesheet of the characters it uses (in a ``<style>``, its
  ``@font-face`` rules pointing at the woff fonts in ``_static/mathjax/``, which
  tools/vendor_frontend.py copies there); no request outside the site;
- a TeX error (an undefined macro: the ``noundefined`` package is removed in
  ``mathjax3_config``; unbalanced braces) fails the build, naming the page and the TeX.

The TeX and CHTML options come from ``mathjax3_config``'s ``tex`` and ``chtml`` blocks.
Pages already typeset (a page that an incremental build did not rewrite) are left alone.
"""

from __future__ import annotations

import html
import html.entities
import json
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from sphinx.errors import ExtensionError
from sphinx.util import logging

logger = logging.getLogger(__name__)

RENDERER = "normcore_mathjax"
HERE = Path(__file__).resolve().parent
WORKER = HERE / "mathjax_prerender.js"
#: where MathJax keeps its woff fonts, in its es5/ folder and so in _static/mathjax/
#: (tools/vendor_frontend.py copies them there, and only them)
FONTS_IN_MATHJAX = ("output", "chtml", "fonts", "woff-v2")
#: the same, relative to the site root
FONTS = "/".join(("_static", "mathjax") + FONTS_IN_MATHJAX)
#: folders of the output that hold no pages
SKIP_DIRS = {"_static", "_sources", "_downloads", "_images"}

# An element MathJax typesets in the browser: Sphinx's math markup (class "math"). Inline
# math is a <span> of text; display math a <div> that may hold the equation number's
# <span class="eqno"> (no nested <div>).
_MATH_EL = re.compile(
    r'(<(span|div)\b[^>]*\bclass="(?:[^"]*\s)?math(?:\s[^"]*)?"[^>]*>)(.*?)(</\2>)', re.S
)
# myst-nb's widget state in a page: (opening tag)(the state's JSON)(closing tag); one of
# the page's scripts until normcore_widget_state.py moves the JSON to a file of its own
STATE = re.compile(
    r'(<script type="application/vnd\.jupyter\.widget-state\+json">)(.*?)(</script>)', re.S
)
# TeX still to typeset: MathJax's delimiters (inline \(...\), display \[...\] and $$...$$,
# and environments)
_TEX = re.compile(r"\\\(|\\\[|\$\$|\\begin\{")
_STYLE_ID = "normcore-math"


@dataclass
class PageMath:
    """One page's math: where each fragment sits and what it is."""

    path: Path
    text: str
    fragments: list[str] = field(default_factory=list)
    # ("html", match) for a .math element; ("state", (script match, model id)) for a caption
    places: list[tuple] = field(default_factory=list)
    # TeX that nothing would typeset: a widget's label or description (shown as text)
    problems: list[str] = field(default_factory=list)


def site_pages(outdir: Path) -> list[Path]:
    """The HTML pages of the built site `outdir` (not the files under _static/ and the like)."""
    return [path for path in sorted(Path(outdir).rglob("*.html"))
            if not SKIP_DIRS & set(path.relative_to(outdir).parts[:-1])]


def find_node_modules(*starts: Path) -> Path:
    """The node_modules/ with MathJax's node entry point, searched upward from each start."""
    for start in starts:
        for d in [start, *start.parents]:
            if (d / "node_modules" / "mathjax" / "es5" / "node-main.js").is_file():
                return d / "node_modules"
    raise ExtensionError(
        "normcore_math: node_modules/mathjax is missing (searched upward from "
        f"{', '.join(map(str, starts))}): run `make vendor` (npm ci)"
    )


def collect(path: Path) -> PageMath | None:
    """The fragments of a page that still hold TeX, or None if there are none."""
    text = path.read_text(encoding="utf-8")
    page = PageMath(path, text)
    for m in _MATH_EL.finditer(text):
        if _TEX.search(m.group(3)):
            page.fragments.append(m.group(3))
            page.places.append(("html", m))
    for s in STATE.finditer(text):
        state = json.loads(s.group(2))
        for model_id, model in state.get("state", {}).items():
            name, fields = model.get("model_name"), model.get("state", {})
            value = fields.get("value")
            if name == "HTMLMathModel" and isinstance(value, str) and _TEX.search(value):
                page.fragments.append(value)
                page.places.append(("state", (s, model_id)))
                continue
            # ipywidgets shows these as text (or as HTML MathJax would have typeset): with
            # no MathJax on the page their TeX would show raw
            for key in ("value", "description"):
                v = fields.get(key)
                if isinstance(v, str) and _TEX.search(v) and not (key == "value" and name == "HTMLMathModel"):
                    page.problems.append(f"TeX in a widget's {name}.{key}, which nothing typesets "
                                         f"(put math in an HTMLMath caption): {v[:80]!r}")
    return page if page.fragments or page.problems else None


_NAMED_ENTITY = re.compile(r"&([A-Za-z][A-Za-z0-9]*;)")
_MARKUP_ENTITIES = {"lt;", "gt;", "amp;", "quot;", "apos;"}


def _decode_entities(fragment: str) -> str:
    """Named character references (&ndash;) as the characters they stand for, but for those
    that protect markup (&lt; &gt; &amp; &quot; &apos;). MathJax's own HTML parser in node
    knows only a few names and would load the rest asynchronously, which it cannot do
    while it parses; a browser decodes them all before MathJax sees the text."""
    def one(m):
        if m.group(1) in _MARKUP_ENTITIES:
            return m.group(0)
        return html.entities.html5.get(m.group(1), m.group(0))

    return _NAMED_ENTITY.sub(one, fragment)


def typeset(fragments: list[str], *, node_modules: Path, font_url: str, config: dict) -> dict:
    """Run mathjax_prerender.js on one page's fragments."""
    node = shutil.which("node")
    if node is None:
        raise ExtensionError("normcore_math: `node` is not on PATH (the book's math is typeset at build time)")
    request = {
        "mathjax": str(node_modules / "mathjax"),
        "fontURL": font_url,
        "config": config,
        "fragments": [_decode_entities(f) for f in fragments],
    }
    proc = subprocess.run(
        [node, str(WORKER)], input=json.dumps(request), capture_output=True, text=True,
        encoding="utf-8", timeout=600,
    )
    if proc.returncode != 0:
        raise ExtensionError(f"normcore_math: MathJax failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def minify_css(css: str) -> str:
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    css = re.sub(r"\s+", " ", css)
    css = re.sub(r"\s*([{};,>])\s*", r"\1", css).replace(": ", ":")
    return css.replace(";}", "}").strip()


def _script_json(obj) -> str:
    # JSON inside <script>: no "</" may end the element early
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")


# Every container MathJax makes in node carries the same inline style (node cannot measure
# the reader's font: one scale for all); it goes into the stylesheet once instead.
_CONTAINER_STYLE = re.compile(r'(<mjx-container class="MathJax" jax="CHTML") '
                              r'style="font-size: ([\d.]+)%; position: relative;"')


_MATHML_NS = '<math xmlns="http://www.w3.org/1998/Math/MathML"'


def shorten(fragments: list[str]) -> tuple[list[str], str]:
    """The fragments without the containers' common inline style (returned as CSS) and
    without the MathML namespace (the HTML parser puts <math> in it by itself)."""
    fragments = [f.replace(_MATHML_NS, "<math") for f in fragments]
    sizes = {m.group(2) for f in fragments for m in _CONTAINER_STYLE.finditer(f)}
    if len(sizes) != 1:
        return fragments, ""
    css = f'mjx-container[jax="CHTML"]{{font-size:{sizes.pop()}%;position:relative}}'
    return [_CONTAINER_STYLE.sub(r"\1", f) for f in fragments], css


def rewrite(page: PageMath, result: dict) -> str:
    """The page with each fragment replaced by its typeset version and the stylesheet added."""
    out, container_css = shorten(result["fragments"])
    edits = []  # (start, end, replacement) in the page's text
    states: dict[int, tuple] = {}  # script start -> (match, parsed state)
    for (kind, where), new in zip(page.places, out):
        if kind == "html":
            m = where
            edits.append((m.start(3), m.end(3), new))
        else:
            s, model_id = where
            if s.start() not in states:
                states[s.start()] = (s, json.loads(s.group(2)))
            states[s.start()][1]["state"][model_id]["state"]["value"] = new
    for s, state in states.values():
        edits.append((s.start(2), s.end(2), _script_json(state)))
    text = page.text
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    # data-assistive-mml: whether every formula carries the MathML that screen readers read
    # (tools/a11y.py reads it)
    assistive = "true" if result["assistive"] == result["formulas"] else "false"
    style = (f'<style id="{_STYLE_ID}" data-mathjax="{html.escape(result["version"])}" '
             f'data-output="chtml" data-assistive-mml="{assistive}">{minify_css(result["css"])}{container_css}</style>')
    old = re.search(rf'<style id="{_STYLE_ID}"[^>]*>.*?</style>', text, re.S)
    if old:
        text = text[:old.start()] + style + text[old.end():]
    else:
        text = text.replace("</head>", style + "\n</head>", 1)
    return text


def prerender_site(outdir: Path, *, config: dict, node_modules: Path, jobs: int = 2) -> dict:
    """Typeset every page under `outdir` that still holds TeX. Returns counts; raises
    ExtensionError listing every TeX error."""
    outdir = Path(outdir)
    pages = [page for page in map(collect, site_pages(outdir)) if page is not None]

    def one(page: PageMath):
        if not page.fragments:
            return page, {"formulas": 0, "errors": []}
        depth = len(page.path.relative_to(outdir).parts) - 1
        font_url = "../" * depth + FONTS
        result = typeset(page.fragments, node_modules=node_modules, font_url=font_url, config=config)
        page.path.write_text(rewrite(page, result), encoding="utf-8")
        return page, result

    errors, formulas = [], 0
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for page, result in pool.map(one, pages):
            formulas += result["formulas"]
            rel = page.path.relative_to(outdir).as_posix()
            for e in result["errors"]:
                errors.append(f"{rel}: {e['message']} in {e['tex']!r}")
            errors += [f"{rel}: {p}" for p in page.problems]
    if errors:
        raise ExtensionError(
            f"normcore_math: {len(errors)} TeX error(s) (the page shows them as red boxes or raw TeX):\n  "
            + "\n  ".join(errors)
        )
    return {"pages": sum(1 for p in pages if p.fragments), "formulas": formulas}


# --- Sphinx ------------------------------------------------------------------------------


def _visit_inline(self, node):
    # the markup of the mathjax renderer, as the extensions that adjust it (myst-parser) left it
    visit, _ = self.builder.app.registry.html_inline_math_renderers["mathjax"]
    return visit(self, node)


def _visit_block(self, node):
    visit, _ = self.builder.app.registry.html_block_math_renderers["mathjax"]
    return visit(self, node)


def _mathjax_options(app) -> dict:
    cfg = app.config.mathjax3_config or {}
    return {"tex": cfg.get("tex", {}), "chtml": cfg.get("chtml", {})}


def _build_finished(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    if getattr(app.builder, "math_renderer_name", None) != RENDERER:
        return
    node_modules = find_node_modules(HERE, Path(app.srcdir).resolve())
    counts = prerender_site(Path(app.outdir), config=_mathjax_options(app), node_modules=node_modules,
                            jobs=min(4, os.cpu_count() or 1))
    logger.info(f"normcore_math: typeset {counts['formulas']} formulas on {counts['pages']} pages (MathJax, CHTML)")


def setup(app):
    app.setup_extension("sphinx.ext.mathjax")  # its config values and its markup
    app.add_html_math_renderer(RENDERER, (_visit_inline, None), (_visit_block, None))
    app.connect("build-finished", _build_finished)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
