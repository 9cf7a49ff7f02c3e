"""Widgets coming into view, and what a page loads: waiting until every widget view is
rendered, scrolling through a page as a reader does, waiting for the network to settle,
the files and bytes a page has fetched, its load time, and how soon its first widget responds.
"""

from __future__ import annotations

import time

from .exercise import controls, move_control, signature

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


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


def wait_for_widgets(page, timeout_ms: int = 20_000) -> None:
    """Bring every widget into view once (its manager loads then), and wait up to
    `timeout_ms` until all are rendered; a widget that is not is left to inspect_widgets."""
    page.evaluate(_WIDGETS_INTO_VIEW_JS)
    try:
        page.wait_for_function(_WIDGETS_RENDERED_JS, timeout=timeout_ms)
    except Exception:  # noqa: BLE001 - reported by inspect_widgets
        pass


def load_ms(page) -> float:
    """Milliseconds from navigation start to the end of the page's load event."""
    return page.evaluate("() => { const n = performance.getEntriesByType('navigation')[0];"
                         " return n ? n.loadEventEnd - n.startTime : NaN; }")


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
    found = controls(root) if root.count() else []
    if not found:
        return out
    info = found[0]
    ctl = root.locator('[data-nc-ctl="0"]')
    target = 1 if info["index"] == 0 else info["index"] - 1
    before = signature(root)
    move_control(ctl, info["kind"], target, info["index"])
    t1 = time.monotonic()
    while time.monotonic() - t1 < 10:
        if signature(root) != before:
            out["respond_ms"] = page.evaluate("() => performance.now()") - t["t0"]
            break
        page.wait_for_timeout(10)
    return out
