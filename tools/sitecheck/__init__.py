"""Serve a built book on 127.0.0.1 and inspect its pages in headless Chromium.

Shared by tests/test_site.py (which asserts on the reports), tests/test_a11y.py,
tests/test_classroom.py and benchmarks/site.py (which prints weights and load times).
Nothing here asserts; every function reports what it saw.

The browser is Debian's /usr/bin/chromium driven by Playwright (no downloaded browser).
Every request to a host other than the local server is aborted before it leaves the browser
and recorded as external.

    pages     the book's pages, from _toc.yml
    browser   Chromium, the local server, a page opened (its report, a colour mode, cold)
    loading   widgets brought into view and rendered, scrolling, what a page loads, how soon
    inspect   what a page shows: math, images, widgets, overflow, alt text, contrast, the
              size of the text in widgets' frames
    exercise  every control of every widget moved, each move changing the frame
    weight    a page's own weight on disk

The JavaScript they run in the page is in js/, one function a file, read by _js.load().
"""

from .browser import (CHROMIUM, CHROMIUM_ARGS, PHONE, VIEWPORT, LocalServer, PageReport, launch,
                      open_cold, open_in_mode, open_page)
from .exercise import controls, exercise_widgets, move_control, signature
from .inspect import (inspect_alt_text, inspect_aspect, inspect_contrast, inspect_downloads,
                      inspect_favicon, inspect_frame_text, inspect_images, inspect_math,
                      inspect_overflow, inspect_widgets, visible_text_matches)
from .loading import (WIDGET_STATE, WIDGET_VIEW, first_widget_response, load_ms, loaded_bytes,
                      loaded_files, ready_ms, scroll_through, settle, wait_for_widgets)
from .pages import toc_pages
from .weight import PAGE_BUDGET, PageWeight, dir_size, page_weight, sha256

__all__ = [
    "CHROMIUM", "CHROMIUM_ARGS", "PAGE_BUDGET", "PHONE", "VIEWPORT", "WIDGET_STATE",
    "WIDGET_VIEW", "LocalServer", "PageReport", "PageWeight", "controls", "dir_size",
    "exercise_widgets", "first_widget_response", "inspect_alt_text", "inspect_aspect",
    "inspect_contrast", "inspect_downloads", "inspect_favicon", "inspect_frame_text",
    "inspect_images", "inspect_math", "inspect_overflow", "inspect_widgets", "launch",
    "load_ms", "loaded_bytes", "loaded_files", "move_control", "open_cold", "open_in_mode",
    "open_page", "page_weight", "ready_ms", "scroll_through", "settle", "sha256", "signature",
    "toc_pages", "visible_text_matches", "wait_for_widgets",
]
