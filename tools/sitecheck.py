"""Serve a built book on 127.0.0.1 and inspect its pages in headless Chromium.

Shared by tests/test_site.py (which asserts on the reports) and benchmarks/site.py (which
prints weights and load times). Nothing here asserts; every function reports what it saw.

The browser is Debian's /usr/bin/chromium driven by Playwright (no downloaded browser).
Every request to a host other than the local server is aborted before it leaves the browser
and recorded as external.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

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
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PAGE_BUDGET = 3 * 1024 * 1024  # bytes of a page's own weight


# --- the table of contents -----------------------------------------------------------------


def toc_pages(toc_file: Path) -> list[str]:
    """HTML paths (relative to the site root) of every file in a jb-book _toc.yml, in order."""
    toc = yaml.safe_load(Path(toc_file).read_text(encoding="utf-8"))
    files = [toc["root"]]

    def visit(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            visit(entry.get("sections"))
            visit(entry.get("chapters"))

    for part in toc.get("parts", []):
        visit(part.get("chapters"))
    visit(toc.get("chapters"))
    return [re.sub(r"\.(md|ipynb|rst)$", "", f) + ".html" for f in files]


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

    def __enter__(self) -> "LocalServer":
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


def _mode_script(mode: str) -> str:
    # the theme's own switch persists the reader's choice in localStorage "mode" (and "theme"),
    # which pydata-sphinx-theme reads as the page loads
    return (f"try {{ localStorage.setItem('mode', '{mode}'); localStorage.setItem('theme', '{mode}'); }}"
            " catch (e) {}")


def load_ms(page) -> float:
    """Milliseconds from navigation start to the end of the page's load event."""
    return page.evaluate("() => { const n = performance.getEntriesByType('navigation')[0];"
                         " return n ? n.loadEventEnd - n.startTime : NaN; }")


def open_page(browser, server: LocalServer, rel: str, *, settle_ms: int = 300, mode: str | None = None):
    """Open `rel` in a fresh context (in the theme's colour `mode`, "light" or "dark", if
    given); return (context, page, report) once the widgets have had their chance to
    render. The caller closes the context."""
    report = PageReport(rel)
    context = browser.new_context(viewport=VIEWPORT, service_workers="block")
    if mode is not None:
        context.add_init_script(_mode_script(mode))
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
    _wait_for_widgets(page)
    page.wait_for_timeout(settle_ms)
    report.math = inspect_math(page)
    report.broken_images = inspect_images(page)
    report.widgets = inspect_widgets(page)
    report.favicon = inspect_favicon(page)
    report.downloads = inspect_downloads(page)
    return context, page, report


# JS: a page's widget views, and whether a view has been rendered (the manager puts the
# widget in a .widget-subarea just before the view's script)
VIEWS_JS = f"""Array.from(document.querySelectorAll('script[type="{WIDGET_VIEW}"]'))"""
IS_RENDERED_JS = """(s => { const p = s.previousElementSibling;
    return !!(p && p.classList.contains('widget-subarea') && p.querySelector('.jupyter-widgets')); })"""
_WIDGETS_RENDERED_JS = f"""() => {VIEWS_JS}.every({IS_RENDERED_JS})"""


_WIDGETS_INTO_VIEW_JS = f"""async () => {{
    // the widget manager loads when a widget comes near the viewport (normcore-widgets.js):
    // bring each widget into view once, then go back to the top
    const views = {VIEWS_JS};
    if (!views.length) return;
    const y = window.scrollY;
    for (const v of views) {{
        if (!v.parentElement) continue;
        v.parentElement.scrollIntoView({{block: 'center'}});
        await new Promise(r => requestAnimationFrame(() => setTimeout(r, 50)));
    }}
    window.scrollTo(0, y);
}}"""


def _wait_for_widgets(page, timeout_ms: int = 20_000) -> None:
    page.evaluate(_WIDGETS_INTO_VIEW_JS)
    try:
        page.wait_for_function(_WIDGETS_RENDERED_JS, timeout=timeout_ms)
    except Exception:  # noqa: BLE001 - reported by inspect_widgets
        pass


def inspect_math(page) -> dict:
    """Every .math element typeset (by MathJax, when the book was built): no raw TeX
    delimiters left, an mjx-container inside, no MathJax error nodes."""
    return page.evaluate(
        r"""() => {
            const els = Array.from(document.querySelectorAll('.math'));
            const untypeset = [], errors = [];
            for (const el of els) {
                const raw = Array.from(el.childNodes)
                    .filter(n => n.nodeType === Node.TEXT_NODE).map(n => n.textContent).join('');
                if (!el.querySelector('mjx-container') || /\\\(|\\\[|\$\$/.test(raw))
                    untypeset.push(el.textContent.slice(0, 80));
            }
            for (const e of document.querySelectorAll('mjx-merror, [data-mjx-error]'))
                errors.push((e.getAttribute('data-mjx-error') || e.textContent).slice(0, 120));
            return {total: els.length, untypeset, errors,
                    containers: document.querySelectorAll('mjx-container').length};
        }"""
    )


def inspect_images(page) -> list[str]:
    """src of every <img> that did not load (naturalWidth 0)."""
    return page.evaluate(
        """async () => {
            const imgs = Array.from(document.images);
            for (const img of imgs) { img.loading = 'eager'; }
            await Promise.all(imgs.map(img => img.complete ? null :
                new Promise(r => { img.onload = img.onerror = r; setTimeout(r, 5000); })));
            return imgs.filter(img => !(img.complete && img.naturalWidth > 0))
                       .map(img => img.getAttribute('src'));
        }"""
    )


def inspect_aspect(page, tolerance: float = 0.02) -> list[dict]:
    """Images of the article shown at another aspect ratio than their own (squashed or
    stretched by more than ``tolerance``, relative): a width capped by the column with a
    height fixed by the img's attribute does that."""
    return page.evaluate(
        """async (tol) => {
            const imgs = Array.from(document.querySelectorAll('article img'));
            for (const img of imgs) { img.loading = 'eager'; }
            await Promise.all(imgs.map(img => img.complete ? null :
                new Promise(r => { img.onload = img.onerror = r; setTimeout(r, 5000); })));
            const bad = [];
            for (const img of imgs) {
                // the content box: dark mode puts padding (a light card) around a figure
                const r = img.getBoundingClientRect(), cs = getComputedStyle(img);
                const px = k => parseFloat(cs[k]) || 0;
                const w = r.width - px('paddingLeft') - px('paddingRight')
                          - px('borderLeftWidth') - px('borderRightWidth');
                const h = r.height - px('paddingTop') - px('paddingBottom')
                          - px('borderTopWidth') - px('borderBottomWidth');
                if (!img.naturalWidth || !img.naturalHeight || w < 2 || h < 2) continue;
                const natural = img.naturalWidth / img.naturalHeight;
                const shown = w / h;
                if (Math.abs(shown / natural - 1) > tol)
                    bad.push({src: (img.getAttribute('src') || '').slice(0, 80),
                              natural: +natural.toFixed(3), shown: +shown.toFixed(3)});
            }
            return bad;
        }""", tolerance)


def inspect_favicon(page) -> dict:
    return page.evaluate(
        """async () => {
            const link = document.querySelector('link[rel~="icon"]');
            if (!link) return {href: null, status: null, type: null};
            const r = await fetch(link.href);
            return {href: link.getAttribute('href'), status: r.status,
                    type: r.headers.get('content-type')};
        }"""
    )


def inspect_downloads(page) -> list[dict]:
    """The download buttons' links (sphinx-book-theme: the page's source, and the notebook
    for .ipynb pages), each fetched."""
    return page.evaluate(
        """async () => {
            const links = Array.from(document.querySelectorAll('a[href*="_sources/"]'));
            const out = [];
            for (const a of links) {
                const r = await fetch(a.href);
                out.push({href: a.getAttribute('href'), status: r.status, bytes: (await r.arrayBuffer()).byteLength});
            }
            return out;
        }"""
    )


def inspect_widgets(page) -> dict:
    return page.evaluate(
        f"""() => {{
            const views = {VIEWS_JS};
            const unrendered = [];
            views.forEach((s, i) => {{ if (!{IS_RENDERED_JS}(s)) unrendered.push(i); }});
            const text = document.body.innerText;
            return {{
                views: views.length,
                state_scripts: document.querySelectorAll('script[type="{WIDGET_STATE}"]').length,
                embed_js: Array.from(document.scripts).filter(s => /html-manager\\/embed\\.js/.test(s.src)).length,
                unrendered,
                error_text: /Error displaying widget|Error rendering|model not found/i.test(text),
                raw_json_visible: /"model_id"|"version_major"|widget-view\\+json|IPY_MODEL_/.test(text),
                roots: document.querySelectorAll('.widget-subarea > .jupyter-widgets').length,
            }};
        }}"""
    )


# --- moving every control of every widget -------------------------------------------------------

_SIGNATURE_JS = """async (root) => {
    const visible = e => !!(e.offsetWidth || e.offsetHeight || e.getClientRects().length);
    const parts = [];
    for (const e of root.querySelectorAll('.widget-html-content')) {
        if (visible(e)) parts.push('html:' + e.innerHTML);
    }
    for (const img of root.querySelectorAll('img')) {
        if (!visible(img)) continue;
        try {
            const buf = await (await fetch(img.src)).arrayBuffer();
            const d = await crypto.subtle.digest('SHA-256', buf);
            parts.push('img:' + Array.from(new Uint8Array(d)).map(b => b.toString(16).padStart(2, '0')).join(''));
        } catch (err) { parts.push('img-unreadable:' + img.src); }
    }
    return parts.join('\\n');
}"""

_CONTROLS_JS = """(root) => {
    const found = Array.from(root.querySelectorAll('select, .widget-toggle-buttons, .noUi-handle'));
    return found.map((el, i) => {
        el.setAttribute('data-nc-ctl', String(i));
        if (el.tagName === 'SELECT')
            return {kind: 'select', n: el.options.length, index: el.selectedIndex};
        if (el.classList.contains('widget-toggle-buttons')) {
            const b = Array.from(el.querySelectorAll('button'));
            return {kind: 'toggle', n: b.length, index: b.findIndex(x => x.classList.contains('mod-active'))};
        }
        const max = Math.round(parseFloat(el.getAttribute('aria-valuemax')));
        const min = Math.round(parseFloat(el.getAttribute('aria-valuemin')));
        const now = Math.round(parseFloat(el.getAttribute('aria-valuenow')));
        return {kind: 'slider', n: max - min + 1, index: now - min};
    });
}"""


def _frames_shot(root) -> bytes | None:
    frames = root.locator(".normcore-frames").first
    if frames.count() == 0:
        return None
    return frames.screenshot()


def _wait_change(page, root, before: str, timeout_s: float = 5.0) -> str:
    t0 = time.monotonic()
    sig = before
    while time.monotonic() - t0 < timeout_s:
        sig = root.evaluate(_SIGNATURE_JS)
        if sig != before:
            page.wait_for_timeout(100)  # let the new frame finish rendering
            return root.evaluate(_SIGNATURE_JS)
        page.wait_for_timeout(50)
    return sig


def move_control(ctl, kind: str, target: int, current: int) -> None:
    """Move a widget control (a locator of its data-nc-ctl element) from value index
    `current` to `target` as a reader would: pick the option, click the button, or press an
    arrow key (a slider moves one step)."""
    if kind == "select":
        ctl.select_option(index=target)
    elif kind == "toggle":
        ctl.locator("button").nth(target).click()
    else:
        ctl.focus()
        ctl.press("ArrowRight" if target > current else "ArrowLeft")


def exercise_widgets(page, report: PageReport, shots_dir: Path | None = None) -> None:
    """Move every control of every rendered widget through all its values; after each move
    the visible frame (HTML content and image pixels, and a screenshot of the frame area
    for static_widget widgets) must differ from before. Appends to report.moves/problems."""
    roots = page.locator(".widget-subarea > .jupyter-widgets")
    for w in range(roots.count()):
        root = roots.nth(w)
        root.scroll_into_view_if_needed()
        controls = root.evaluate(_CONTROLS_JS)
        for c, info in enumerate(controls):
            ctl = root.locator(f'[data-nc-ctl="{c}"]')
            order = [i for i in range(info["n"]) if i != info["index"]]
            if info["kind"] == "slider":
                # the keyboard moves a slider one step: sweep up to the end, then down to 0
                i, n = info["index"], info["n"]
                up = list(range(i + 1, n))
                order = up + list(range((n - 2) if up else (i - 1), -1, -1))
            current = info["index"]
            for target in order:
                before = root.evaluate(_SIGNATURE_JS)
                shot_before = _frames_shot(root)
                move_control(ctl, info["kind"], target, current)
                after = _wait_change(page, root, before)
                shot_after = _frames_shot(root)
                move = {
                    "widget": w, "control": c, "kind": info["kind"], "from": current, "to": target,
                    "frame_changed": after != before,
                    "pixels_changed": None if shot_before is None else shot_before != shot_after,
                }
                report.moves.append(move)
                if not move["frame_changed"] or move["pixels_changed"] is False:
                    report.problems.append(
                        f"{report.rel}: widget {w}, control {c} ({info['kind']}) {current}->{target}: "
                        "the visible frame did not change"
                    )
                if shots_dir is not None and shot_after is not None:
                    shots_dir.mkdir(parents=True, exist_ok=True)
                    name = f"{Path(report.rel).with_suffix('').as_posix().replace('/', '__')}__w{w}c{c}v{target}.png"
                    (shots_dir / name).write_bytes(shot_after)
                current = target


# --- weight -------------------------------------------------------------------------------------------


_IMG_SRC = re.compile(r"""<img\b[^>]*?\bsrc=["']([^"']+)["']""", re.I)
# a frame in the widget state file, moved to _frames/ (JSON escapes the attribute's quotes)
_FRAME_SRC = re.compile(r'<img src=\\"([^"\\]+)\\"')
_STATE_SRC = re.compile(r'<script\b[^>]*\bdata-normcore-src="([^"]+)"[^>]*>')
_STATE = re.compile(r'<script type="application/vnd\.jupyter\.widget-state\+json">(.*?)</script>', re.S)
# typeset math, in the page or in the widget state (where JSON writes "</" as "<\/")
_MATH_MARKUP = re.compile(r'<mjx-container\b.*?<\\?/mjx-container>|<style id="normcore-math".*?</style>', re.S)


@dataclass
class PageWeight:
    rel: str
    html: int
    images: int
    widget_state: int  # part of `html`, or in `state_file`
    embed_js: bool
    math: int = 0  # the typeset math (CHTML markup, its stylesheet), in `html` or the state file
    state_file: int = 0  # the page's <page>.widget-state.js, loaded with the widget manager
    frames: int = 0  # the widgets' frames in _frames/, each fetched when it is shown

    @property
    def own(self) -> int:
        return self.html + self.images + self.state_file + self.frames


def page_weight(html_dir: Path, rel: str) -> PageWeight:
    """A page's own weight: its HTML, its widget state (in the HTML or a file of its own), the
    widgets' frames, and the images it references outside _static/ (shared by every page,
    counted separately)."""
    path = Path(html_dir) / rel
    text = path.read_text(encoding="utf-8")
    images = 0
    seen = set()
    for src in _IMG_SRC.findall(text):
        if src.startswith(("data:", "http:", "https:")) or "_static/" in src:
            continue
        f = (path.parent / src.split("?")[0].split("#")[0]).resolve()
        if f not in seen and f.is_file():
            seen.add(f)
            images += f.stat().st_size
    state = sum(len(m.encode("utf-8")) for m in _STATE.findall(text))
    # the widget state moved to a file of its own (assets/sphinx_ext/normcore_widget_state.py)
    # counts too
    files = [path.parent / src for src in sorted(set(_STATE_SRC.findall(text)))]
    files_text = [f.read_text(encoding="utf-8") for f in files if f.is_file()]
    state_file = sum(len(s.encode("utf-8")) for s in files_text)
    math = sum(len(m.encode("utf-8")) for s in [text, *files_text] for m in _MATH_MARKUP.findall(s))
    frame_files = {(path.parent / src).resolve() for s in files_text for src in _FRAME_SRC.findall(s)}
    missing = sorted(str(f) for f in frame_files if not f.is_file())
    if missing:
        raise FileNotFoundError(f"{rel}: widget frames missing from the site: {missing[:3]}")
    frames = sum(f.stat().st_size for f in frame_files)
    return PageWeight(rel, len(text.encode("utf-8")), images, state + state_file,
                      "html-manager/embed.js" in text, math, state_file, frames)


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# --- readable on every screen -------------------------------------------------------------------

PHONE = {"width": 390, "height": 844}

_OVERFLOW_JS = r"""(phone) => {
    // Everything a reader must see whole: code blocks, cell outputs, display equations,
    // tables, images, widgets. An element is "too wide" when its content is wider than its
    // own box (it scrolls or is clipped) or when its box sticks out of the article column.
    // On a phone (phone = true) only code *inputs* may scroll inside their own box.
    const col = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
    const right = col.getBoundingClientRect().right + 1;
    const out = [];
    const seen = new Set();
    const name = (el) => {
        const cls = (el.className && el.className.baseVal === undefined) ? String(el.className) : '';
        const sec = el.closest('section[id]');
        const text = (el.innerText || el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 70);
        return `${el.tagName.toLowerCase()}${cls ? '.' + cls.split(/\s+/).slice(0, 2).join('.') : ''}`
             + `${sec ? ' in #' + sec.id : ''}: "${text}"`;
    };
    const check = (el, kind, mayScroll) => {
        if (seen.has(el) || !(el.offsetWidth || el.getClientRects().length)) return;
        seen.add(el);
        const r = el.getBoundingClientRect();
        const inner = el.scrollWidth - el.clientWidth;
        if (r.right > right + 0.5)
            out.push({kind, what: name(el), by: Math.round(r.right - right), how: 'sticks out of the column'});
        else if (inner > 1 && !mayScroll)
            out.push({kind, what: name(el), by: inner, how: 'wider than its box (scrolls)'});
    };
    for (const el of document.querySelectorAll('div.cell_input pre, div.highlight pre')) {
        const isOutput = !!el.closest('div.cell_output');
        check(el, isOutput ? 'output' : 'code', phone && !isOutput);
    }
    for (const el of document.querySelectorAll('div.cell_output pre, div.output pre'))
        check(el, 'output', false);
    for (const el of document.querySelectorAll('div.math, mjx-container[display="true"]')) {
        check(el, 'equation', false);
        const m = el.querySelector && el.querySelector('mjx-math');
        if (m) {
            const host = el.closest('div.math') || el;
            const w = m.getBoundingClientRect().width, have = host.clientWidth;
            if (w > have + 1 && !seen.has(m)) {
                seen.add(m);
                out.push({kind: 'equation', what: name(host), by: Math.round(w - have), how: 'formula wider than its column'});
            }
        }
    }
    for (const el of document.querySelectorAll('article table, article img, .jupyter-widgets.widget-vbox, div.admonition'))
        check(el, el.tagName.toLowerCase() === 'table' ? 'table' : el.tagName.toLowerCase() === 'img' ? 'image' : 'box', false);
    const page = document.documentElement.scrollWidth - window.innerWidth;
    return {items: out, page_overflow: page > 1 ? page : 0, column: Math.round(col.getBoundingClientRect().width)};
}"""


def inspect_overflow(page, phone: bool) -> dict:
    """Elements wider than the article column (see _OVERFLOW_JS), and by how much the page
    itself scrolls sideways."""
    return page.evaluate(_OVERFLOW_JS, phone)


_ALT_JS = r"""() => {
    // Every figure image of the article (not the theme's logo, not widget frames, whose text
    // alternatives normcore.widgets provides) has alt text that says something: not empty,
    // not a file name or a content hash.
    const bad = [];
    for (const img of document.querySelectorAll('article.bd-article img')) {
        if (img.closest('.jupyter-widgets')) continue;
        const alt = (img.getAttribute('alt') || '').trim();
        const src = img.getAttribute('src') || '';
        const fileish = /\.(png|jpe?g|svg|gif|webp)$/i.test(alt) || /[0-9a-f]{16,}/i.test(alt)
                        || alt === src || alt.split(/\s+/).length < 3;
        if (!alt || fileish) bad.push({src: src.slice(-60), alt: alt.slice(0, 80)});
    }
    return bad;
}"""


def inspect_alt_text(page) -> list[dict]:
    return page.evaluate(_ALT_JS)


def visible_text_matches(page, pattern: str) -> list[str]:
    """Lines of the page's visible text that match a JS regular expression."""
    return page.evaluate(
        """(pat) => document.body.innerText.split('\\n').filter(l => new RegExp(pat).test(l))
                      .map(l => l.trim().slice(0, 120))""",
        pattern,
    )


_CONTRAST_JS = r"""(selector) => {
    // WCAG contrast of the text of every element matching `selector` against the first
    // opaque background behind it.
    const rgb = (s) => { const m = s.match(/[\d.]+/g); return m ? m.map(Number) : [0, 0, 0, 0]; };
    const lum = ([r, g, b]) => {
        const f = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4); };
        return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
    };
    const bg = (el) => {
        for (let e = el; e; e = e.parentElement) {
            const c = rgb(getComputedStyle(e).backgroundColor);
            if (c.length < 4 || c[3] > 0.5) return c;
        }
        return [255, 255, 255];
    };
    const out = [];
    for (const el of document.querySelectorAll(selector)) {
        if (!(el.offsetWidth || el.getClientRects().length)) continue;
        const fg = rgb(getComputedStyle(el).color), b = bg(el);
        const l1 = lum(fg), l2 = lum(b);
        const ratio = (Math.max(l1, l2) + 0.05) / (Math.min(l1, l2) + 0.05);
        out.push({selector, ratio: Math.round(ratio * 100) / 100, color: getComputedStyle(el).color,
                  background: `rgb(${b.slice(0, 3).join(',')})`,
                  text: (el.innerText || '').trim().slice(0, 50)});
    }
    return out;
}"""


def inspect_contrast(page, selector: str) -> list[dict]:
    return page.evaluate(_CONTRAST_JS, selector)


def open_in_mode(browser, server: LocalServer, rel: str, *, viewport: dict | None = None,
                 dark: bool = False, settle_ms: int = 300):
    """Open `rel` like open_page, at `viewport`, in the theme's light or dark mode (set as the
    theme's own switch does: localStorage "mode"/"theme" before the page loads)."""
    context = browser.new_context(viewport=viewport or VIEWPORT, service_workers="block")
    mode = "dark" if dark else "light"
    context.add_init_script(_mode_script(mode))
    local = urlsplit(server.origin).netloc
    context.route("**/*", lambda r: r.continue_() if urlsplit(r.request.url).netloc in (local, "")
                  or urlsplit(r.request.url).scheme in ("data", "blob", "about") else r.abort("blockedbyclient"))
    page = context.new_page()
    page.goto(server.url(rel), wait_until="load", timeout=60_000)
    _wait_for_widgets(page)
    page.wait_for_timeout(settle_ms)
    return context, page


# --- what a page loads: at first, and once scrolled through; how soon a widget responds -----------

_LOADED_JS = """() => [performance.getEntriesByType('navigation')[0]]
    .concat(performance.getEntriesByType('resource'))
    .map(e => ({url: e.name, bytes: e.decodedBodySize}))"""

_SCROLL_THROUGH_JS = f"""async () => {{
    // scroll down one screen at a time, as a reader would, then wait for every widget
    const step = Math.max(200, window.innerHeight - 100);
    for (let y = 0; y < document.documentElement.scrollHeight; y += step) {{
        window.scrollTo(0, y);
        await new Promise(r => requestAnimationFrame(() => setTimeout(r, 50)));
    }}
    window.scrollTo(0, document.documentElement.scrollHeight);
    const t0 = Date.now();
    while (!{VIEWS_JS}.every({IS_RENDERED_JS}) && Date.now() - t0 < 30000)
        await new Promise(r => setTimeout(r, 50));
}}"""

_FIRST_WIDGET_INTO_VIEW_JS = f"""async () => {{
    // scroll the first widget into the middle of the screen; milliseconds until it renders
    const v = document.querySelector('script[type="{WIDGET_VIEW}"]');
    if (!v) return null;
    v.parentElement.scrollIntoView({{block: 'center'}});
    const t0 = performance.now();
    while (!{IS_RENDERED_JS}(v)) {{
        if (performance.now() - t0 > 30000) return {{t0, rendered: NaN}};
        await new Promise(r => setTimeout(r, 5));
    }}
    return {{t0, rendered: performance.now()}};
}}"""


def open_cold(browser, server: LocalServer, rel: str, *, viewport: dict | None = None):
    """`rel` in a fresh context (cold cache), every resource timed (no 250-entry cap); returns
    (context, page) once the load event has fired. The caller closes the context."""
    context = browser.new_context(viewport=viewport or VIEWPORT, service_workers="block")
    context.add_init_script("performance.setResourceTimingBufferSize(100000);")
    page = context.new_page()
    page.goto(server.url(rel), wait_until="load", timeout=60_000)
    return context, page


def loaded_files(page) -> list[dict]:
    """Everything the page has fetched so far, the document first: [{"url", "bytes"}, ...]
    (decoded bytes)."""
    return page.evaluate(_LOADED_JS)


def loaded_bytes(page) -> int:
    """Decoded bytes of everything the page has fetched so far (the document included)."""
    return sum(f["bytes"] for f in loaded_files(page))



def settle(page, quiet_ms: int = 500, timeout_ms: int = 15_000) -> None:
    """Wait until the page has fetched nothing for `quiet_ms`."""
    try:
        page.wait_for_load_state("networkidle", timeout=timeout_ms)
    except Exception:  # noqa: BLE001 - a page that never settles is measured as it is
        pass
    page.wait_for_timeout(quiet_ms // 5)


def scroll_through(page) -> None:
    """Scroll from top to bottom a screen at a time, then wait until every widget rendered
    and nothing more is fetched."""
    page.evaluate(_SCROLL_THROUGH_JS)
    settle(page)


def first_widget_response(page) -> dict | None:
    """Scroll the page's first widget into view and move its first control: milliseconds from
    the scroll until the widget is rendered ("render_ms") and until the move has changed its
    frame ("respond_ms"). None for a page without widgets."""
    t = page.evaluate(_FIRST_WIDGET_INTO_VIEW_JS)
    if t is None:
        return None
    root = page.locator(".widget-subarea > .jupyter-widgets").first
    out = {"render_ms": t["rendered"] - t["t0"], "respond_ms": float("nan")}
    controls = root.evaluate(_CONTROLS_JS) if root.count() else []
    if not controls:
        return out
    info = controls[0]
    ctl = root.locator('[data-nc-ctl="0"]')
    target = 1 if info["index"] == 0 else info["index"] - 1
    before = root.evaluate(_SIGNATURE_JS)
    move_control(ctl, info["kind"], target, info["index"])
    t1 = time.monotonic()
    while time.monotonic() - t1 < 10:
        if root.evaluate(_SIGNATURE_JS) != before:
            out["respond_ms"] = page.evaluate("() => performance.now()") - t["t0"]
            break
        page.wait_for_timeout(10)
    return out
