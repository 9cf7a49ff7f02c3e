"""Copy the front-end files the built book serves from itself into assets/_vendor/.

The sources are the npm packages pinned in package.json / package-lock.json (installed by
`npm ci` into node_modules/). assets/_vendor/ is gitignored and listed in html_static_path,
so Sphinx serves it as _static/:

  _static/mathjax/tex-chtml.js       MathJax 3 (mathjax_path), plus what it loads lazily:
                                     its fonts (output/chtml/fonts/woff-v2), TeX extensions
                                     (input/tex/extensions, for \\require and autoload), the
                                     menu/accessibility components (ui, a11y, sre, adaptors).
  _static/html-manager/embed.js      @jupyter-widgets/html-manager (ipywidgets 8) and the
                                     Font Awesome files that its CSS loads from beside itself.

Run by `make book` / `make test`; idempotent (re-copies only when the sources changed).
"""

from __future__ import annotations

import filecmp
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NODE = ROOT / "node_modules"
DEST = ROOT / "assets" / "_vendor"

# MathJax's es5/ holds several combined bundles; the book loads only tex-chtml.js.
MATHJAX_SKIP_TOP = {
    "tex-chtml-full.js", "tex-chtml-full-speech.js", "tex-mml-chtml.js", "tex-mml-svg.js",
    "tex-svg.js", "tex-svg-full.js", "mml-chtml.js", "mml-svg.js", "node-main.js",
}


def _want_mathjax(rel: Path) -> bool:
    if len(rel.parts) == 1:
        return rel.name not in MATHJAX_SKIP_TOP
    # the SVG output is not used by tex-chtml.js
    return not (rel.parts[0] == "output" and len(rel.parts) > 1 and rel.parts[1] == "svg")


def _want_html_manager(rel: Path) -> bool:
    # embed.js (standalone, no require.js) and the font files webpack emitted next to it.
    if len(rel.parts) != 1:
        return False
    name = rel.name
    if name in ("embed.js", "embed.js.LICENSE.txt"):
        return True
    return rel.suffix in {".woff", ".woff2", ".ttf", ".eot", ".svg"}


def _copy_tree(src: Path, dst: Path, want) -> int:
    if not src.is_dir():
        sys.exit(f"vendor_frontend: {src} is missing; run `npm ci` first")
    n = 0
    keep = set()
    for f in sorted(src.rglob("*")):
        if not f.is_file():
            continue
        rel = f.relative_to(src)
        if not want(rel):
            continue
        out = dst / rel
        keep.add(out)
        if out.exists() and filecmp.cmp(f, out, shallow=False):
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, out)
        n += 1
    # drop files that a previous version of the package had
    if dst.exists():
        for f in dst.rglob("*"):
            if f.is_file() and f not in keep:
                f.unlink()
    return n


def _version(pkg: Path) -> str:
    return json.loads((pkg / "package.json").read_text())["version"]


def main() -> None:
    mj = NODE / "mathjax"
    hm = NODE / "@jupyter-widgets" / "html-manager"
    n1 = _copy_tree(mj / "es5", DEST / "mathjax", _want_mathjax)
    n2 = _copy_tree(hm / "dist", DEST / "html-manager", _want_html_manager)
    if not (DEST / "mathjax" / "tex-chtml.js").is_file() or not (DEST / "html-manager" / "embed.js").is_file():
        sys.exit("vendor_frontend: tex-chtml.js or embed.js missing after copy")
    print(
        f"vendor_frontend: mathjax {_version(mj)}, @jupyter-widgets/html-manager {_version(hm)} "
        f"-> {DEST.relative_to(ROOT)} ({n1 + n2} files updated)"
    )


if __name__ == "__main__":
    main()
