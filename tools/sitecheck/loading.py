"""Widgets coming into view, and what a page loads: waiting until every widget view is
rendered, scrolling through a page as a reader does, waiting for the network to settle,
the files and bytes a page has fetched, its load time, and how soon it is ready and its first
widget responds. The JavaScript is in js/<name>.js.
"""

from __future__ import annotations

import contextlib
import time

from . import _js
from .exercise import controls, move_control, signature

#: the types of a widget view's script and of the page's widget state script
#: (js/widget_views.js and js/widgets.js select them)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def wait_for_widgets(page, timeout_ms: int = 20_000) -> None:
    """Bring every widget into view once (its manager loads then), and wait up to
    `timeout_ms` until all are rendered; a widget that is not is left to inspect_widgets."""
    page.evaluate(_js.load("widgets_into_view"))
    with contextlib.suppress(Exception):  # a widget that does not render: inspect_widgets says so
        page.wait_for_function(_js.load("widgets_rendered"), timeout=timeout_ms)


def load_ms(page) -> float:
    """Milliseconds from navigation start to the end of the page's load event."""
    return page.evaluate(_js.load("load_ms"))


def ready_ms(page) -> float:
    """Milliseconds from navigation start until the page's math is typeset and every widget
    of its first screen is rendered (and so responds); NaN after 30 s."""
    return page.evaluate(_js.load("first_screen_ready"))


def loaded_files(page) -> list[dict]:
    """Everything the page has fetched so far, the document first: [{"url", "bytes"}, ...]
    (decoded bytes)."""
    return page.evaluate(_js.load("loaded_files"))


def loaded_bytes(page) -> int:
    """Decoded bytes of everything the page has fetched so far (the document included)."""
    return sum(f["bytes"] for f in loaded_files(page))


def settle(page, quiet_ms: int = 500, timeout_ms: int = 15_000) -> None:
    """Wait until the page has fetched nothing for `quiet_ms`."""
    with contextlib.suppress(Exception):  # a page that never settles is measured as it is
        page.wait_for_load_state("networkidle", timeout=timeout_ms)
    page.wait_for_timeout(quiet_ms // 5)


def scroll_through(page) -> None:
    """Scroll from top to bottom a screen at a time, then wait until every widget rendered
    and nothing more is fetched."""
    page.evaluate(_js.load("scroll_through"))
    settle(page)


def first_widget_response(page) -> dict | None:
    """Scroll the page's first widget into view and move its first control: milliseconds from
    the scroll until the widget is rendered ("render_ms") and until the move has changed its
    frame ("respond_ms"). None for a page without widgets."""
    t = page.evaluate(_js.load("first_widget_into_view"))
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
            out["respond_ms"] = page.evaluate(_js.load("now")) - t["t0"]
            break
        page.wait_for_timeout(10)
    return out
