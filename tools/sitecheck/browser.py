"""The browser and the server: Debian's headless Chromium, the built book served on
127.0.0.1, and a page opened in a fresh context (its report, a colour mode, a cold cache).

Every request to a host other than the local server is aborted before it leaves the browser
(open_page records it as external).
"""

from __future__ import annotations

import functools
import http.server
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from . import _js
from .inspect import (inspect_downloads, inspect_favicon, inspect_images, inspect_math,
                      inspect_widgets)
from .loading import load_ms, wait_for_widgets

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


# --- the local server ------------------------------------------------------------------------


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass


class LocalServer:
    """`with LocalServer(root) as srv:` serves `root` on 127.0.0.1 at a free port, in a thread."""

    def __init__(self, root: Path):
        self.root = Path(root)
        handler = functools.partial(_QuietHandler, directory=str(self.root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.httpd.server_address[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> LocalServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def url(self, rel: str) -> str:
        return f"{self.origin}/{rel}"


def launch(playwright):
    """Headless Debian Chromium (raises if /usr/bin/chromium is missing)."""
    if not Path(CHROMIUM).exists():
        raise FileNotFoundError(f"{CHROMIUM} is missing (Debian package `chromium`)")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


# --- one page ----------------------------------------------------------------------------------


@dataclass
class PageReport:
    rel: str
    requests: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # network failures and HTTP >= 400
    external: list[str] = field(default_factory=list)  # any host but the local server
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    load_ms: float = float("nan")
    math: dict = field(default_factory=dict)
    broken_images: list[str] = field(default_factory=list)
    widgets: dict = field(default_factory=dict)
    favicon: dict = field(default_factory=dict)
    downloads: list[dict] = field(default_factory=list)  # the page's download links (.ipynb, .md)
    moves: list[dict] = field(default_factory=list)  # one per control move
    problems: list[str] = field(default_factory=list)  # widget moves that did not change the frame


def open_page(browser, server: LocalServer, rel: str, *, settle_ms: int = 300, mode: str | None = None):
    """Open `rel` in a fresh context (in the theme's colour `mode`, "light" or "dark", if
    given); return (context, page, report) once the widgets have had their chance to
    render. The caller closes the context."""
    report = PageReport(rel)
    context = browser.new_context(viewport=VIEWPORT, service_workers="block")
    if mode is not None:
        context.add_init_script(_js.init_script("colour_mode", mode))
    page = context.new_page()
    local = urlsplit(server.origin).netloc

    def is_local(url: str) -> bool:
        parts = urlsplit(url)
        return parts.scheme in ("data", "blob", "about") or (
            parts.scheme in ("http", "https") and parts.netloc == local
        )

    def route(r):
        if is_local(r.request.url):
            r.continue_()
        else:
            report.external.append(r.request.url)
            r.abort("blockedbyclient")

    context.route("**/*", route)
    page.on("request", lambda r: report.requests.append(r.url))
    page.on(
        "requestfailed",
        lambda r: report.failed.append(f"{r.url} ({r.failure})") if is_local(r.url) else None,
    )
    page.on("response", lambda r: report.failed.append(f"{r.url} (HTTP {r.status})") if r.status >= 400 else None)
    page.on("console", lambda m: report.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: report.page_errors.append(str(e)))

    page.goto(server.url(rel), wait_until="load", timeout=60_000)
    report.load_ms = load_ms(page)
    wait_for_widgets(page)
    page.wait_for_timeout(settle_ms)
    report.math = inspect_math(page)
    report.broken_images = inspect_images(page)
    report.widgets = inspect_widgets(page)
    report.favicon = inspect_favicon(page)
    report.downloads = inspect_downloads(page)
    return context, page, report


def open_in_mode(browser, server: LocalServer, rel: str, *, viewport: dict | None = None,
                 dark: bool = False, settle_ms: int = 300):
    """Open `rel` like open_page, at `viewport`, in the theme's light or dark mode (set as the
    theme's own switch does: localStorage "mode"/"theme" before the page loads)."""
    context = browser.new_context(viewport=viewport or VIEWPORT, service_workers="block")
    mode = "dark" if dark else "light"
    context.add_init_script(_js.init_script("colour_mode", mode))
    local = urlsplit(server.origin).netloc
    context.route("**/*", lambda r: r.continue_() if urlsplit(r.request.url).netloc in (local, "")
                  or urlsplit(r.request.url).scheme in ("data", "blob", "about") else r.abort("blockedbyclient"))
    page = context.new_page()
    page.goto(server.url(rel), wait_until="load", timeout=60_000)
    wait_for_widgets(page)
    page.wait_for_timeout(settle_ms)
    return context, page


def open_cold(browser, server: LocalServer, rel: str, *, viewport: dict | None = None):
    """`rel` in a fresh context (cold cache), every resource timed (no 250-entry cap); returns
    (context, page) once the load event has fired. The caller closes the context."""
    context = browser.new_context(viewport=viewport or VIEWPORT, service_workers="block")
    context.add_init_script(_js.init_script("time_every_resource"))
    page = context.new_page()
    page.goto(server.url(rel), wait_until="load", timeout=60_000)
    return context, page

