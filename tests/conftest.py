"""Fixtures of the browser tests (marker `site`: tests/test_site.py, tests/test_a11y.py,
tests/test_classroom.py), one of each for the whole session: one headless Chromium, one
server of the built book, one demo book (built once, about a minute; it was built once per
test file before).

When /usr/bin/chromium is missing the browser tests skip, except under CI (CI=true), where
they fail.

One fixture of the package tests: `both_paths`, which runs a test by each of the two
implementations normcore.dispatch chooses from: the compiled kernels and the reference.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import sitecheck  # noqa: E402 - importable once sys.path has its folder

HTML = ROOT / "_build" / "html"


def _require_chromium() -> None:
    if Path(sitecheck.CHROMIUM).exists():
        return
    msg = f"{sitecheck.CHROMIUM} is missing; install Debian's `chromium` package"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(msg + " (CI must run the browser tests, see .ci/run)")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium; each test opens its own context (cold cache, own storage)."""
    _require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = sitecheck.launch(p)
        yield b
        b.close()


def _sources_for_freshness() -> list[Path]:
    files = [ROOT / "_config.yml", ROOT / "_toc.yml", ROOT / "assets" / "references.bib"]
    files += sorted((ROOT / "chapters").glob("*.md")) + sorted((ROOT / "chapters").glob("*.ipynb"))
    files += sorted((ROOT / "normcore").rglob("*.py"))
    files += sorted((ROOT / "assets" / "static").glob("*"))
    files += sorted((ROOT / "assets" / "sphinx_ext").glob("*"))
    return [f for f in files if f.is_file()]


@pytest.fixture(scope="session")
def site():
    """The built book (_build/html), served on 127.0.0.1; fails if it is missing or older
    than its sources."""
    pages = sitecheck.toc_pages(ROOT / "_toc.yml")
    if not (HTML / "index.html").is_file():
        pytest.fail(f"{HTML} has no built book: run `make book` (or `make test`, which builds it)")
    missing = [p for p in pages if not (HTML / p).is_file()]
    assert not missing, f"pages of _toc.yml missing from {HTML}: {missing} (rebuild the book)"
    built = min((HTML / p).stat().st_mtime for p in pages)
    newer = [str(f.relative_to(ROOT)) for f in _sources_for_freshness() if f.stat().st_mtime > built]
    assert not newer, f"the build in {HTML} is older than {newer}: rebuild it (`make book`)"
    with sitecheck.LocalServer(HTML) as server:
        yield server


@pytest.fixture(scope="session")
def demo_site(tmp_path_factory):
    """The demo book of tests/test_site.py (widgets of every kind, pages the checks must
    reject), built once and served."""
    from test_site import build_demo_book

    html = build_demo_book(tmp_path_factory.mktemp("demo-book"))
    with sitecheck.LocalServer(html) as server:
        yield server


@pytest.fixture(params=["kernels", "reference"])
def both_paths(request):
    """The test twice: with the compiled kernels switched on (numba is in requirements.txt, so
    they must run here) and off (every call the reference)."""
    import normcore
    with normcore.use_kernels(request.param == "kernels"):
        assert normcore.kernels_enabled() == (request.param == "kernels"), request.param
        yield request.param
