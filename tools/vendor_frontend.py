"""Copy the front-end files the built book serves from itself into assets/_vendor/.

The sources are the npm packages pinned in package.json / package-lock.json (installed by
`npm ci` into node_modules/). assets/_vendor/ is gitignored and listed in html_static_path,
so Sphinx serves it as _static/:

  _static/mathjax/output/chtml/fonts/woff-v2/
                                     MathJax 3's TeX fonts. The math is typeset when the
                                     book is built (assets/sphinx_ext/normcore_math.py runs
                                     MathJax in node, from node_modules/); the pages load
                                     no MathJax script, only the fonts their math uses.
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

# Of MathJax, the pages need only the CHTML fonts, where the stylesheet that the build writes
# into each page points (the build's math extension says where)
sys.path.insert(0, str(ROOT / "assets" / "sphinx_ext"))
from normcore_math import FONTS_IN_MATHJAX as MATHJAX_FONTS  # noqa: E402 - importable once sys.path has its folder


def _want_mathjax(rel: Path) -> bool:
    return rel.parts[:-1] == MATHJAX_FONTS and rel.suffix == ".woff"


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
        # and the folders they leave empty (deepest first)
        for d in sorted((d for d in dst.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True):
            if not any(d.iterdir()):
                d.rmdir()
    return n


def _version(pkg: Path) -> str:
    return json.loads((pkg / "package.json").read_text())["version"]


def main() -> None:
    mj = NODE / "mathjax"
    hm = NODE / "@jupyter-widgets" / "html-manager"
    n1 = _copy_tree(mj / "es5", DEST / "mathjax", _want_mathjax)
    n2 = _copy_tree(hm / "dist", DEST / "html-manager", _want_html_manager)
    fonts = DEST / "mathjax" / Path(*MATHJAX_FONTS)
    if not (fonts / "MathJax_Main-Regular.woff").is_file() or not (DEST / "html-manager" / "embed.js").is_file():
        sys.exit("vendor_frontend: MathJax's fonts or embed.js missing after copy")
    print(
        f"vendor_frontend: mathjax {_version(mj)}, @jupyter-widgets/html-manager {_version(hm)} "
        f"-> {DEST.relative_to(ROOT)} ({n1 + n2} files updated)"
    )


if __name__ == "__main__":
    main()
