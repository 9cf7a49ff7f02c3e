"""Accessibility of the built book: WCAG 2.1 A and AA, checked in the browser.

Like tests/test_site.py (whose server, browser and freshness checks these reuse), they run
on the fresh build in _build/html (`make test` builds it first), in Debian's headless
Chromium. For every page of the table of contents, in the theme's light and dark mode:

- axe-core (pinned in package.json, injected from node_modules, never fetched) with the
  rules tagged wcag2a, wcag2aa, wcag21a, wcag21aa finds no violation; a failure lists
  each violating node: rule, impact, target, what to fix;
- every control of every static widget is named by its visible label, and the frame on
  show has a text alternative (an <img alt> or an <svg role="img"> with a name);
- every typeset equation carries MathJax's assistive MathML (mjx-assistive-mml), which
  screen readers read.

And for every chapter with static widgets (found in the notebook sources, so later
chapters are picked up), a keyboard-only walk through its first widget: Tab from the top
of the page reaches the first control; on each control the arrow keys move the value and
the frame follows; Tab goes on to the next control.

The screenshots of each page in both modes are test_site's (_build/screenshots/).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import a11y  # noqa: E402 - importable once sys.path has its folder
import sitecheck  # noqa: E402 - importable once sys.path has its folder
from test_site import HTML, PAGES  # noqa: E402  (browser, site, demo_site: tests/conftest.py)

MODES = a11y.MODES
#: chapters whose notebook builds a static widget: the keyboard walk covers each of them
WIDGET_PAGES = [
    rel for rel in PAGES
    if (nb := (ROOT / rel).with_suffix(".ipynb")).is_file() and "static_widget(" in nb.read_text(encoding="utf-8")
]


@pytest.fixture(scope="module")
def book(site):
    """The served site, after checking the template overrides are not newer than it."""
    built = min((HTML / p).stat().st_mtime for p in PAGES)
    newer = [str(f.relative_to(ROOT)) for f in (ROOT / "_templates").glob("*") if f.stat().st_mtime > built]
    assert not newer, f"the build in {HTML} is older than {newer}: rebuild it (`make book`)"
    return site


@pytest.fixture(scope="module")
def audit(book, browser):
    """audit(rel, mode): open the page in that colour mode once, and report axe's
    violations, the widgets' names, the math, and the theme actually shown."""

    @functools.cache
    def run(rel: str, mode: str) -> dict:
        context, page, report = sitecheck.open_page(browser, book, rel, mode=mode)
        try:
            theme = page.evaluate("() => document.documentElement.dataset.theme")
            return {
                "theme": theme,
                "violations": a11y.run_axe(page),
                "controls": a11y.control_names(page),
                "frames": a11y.frame_names(page),
                "math": a11y.math_speech(page),
                "errors": report.console_errors + report.page_errors,
            }
        finally:
            context.close()

    return run


# --- axe-core, every page, both modes ---------------------------------------------------------


@pytest.mark.site
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rel", PAGES)
def test_axe_wcag21_aa(audit, rel, mode):
    r = audit(rel, mode)
    assert r["theme"] == mode, f"{rel}: asked for {mode} mode, the page shows data-theme={r['theme']!r}"
    problems = a11y.format_violations(r["violations"])
    assert not problems, (
        f"{rel} ({mode} mode): axe-core {a11y.axe_version()} finds {len(problems)} WCAG 2.1 A/AA "
        "violation(s):\n  " + "\n  ".join(problems)
    )


# --- the widgets: named controls, frames with a text alternative ---------------------------------


@pytest.mark.site
@pytest.mark.parametrize("rel", PAGES)
def test_widget_controls_and_frames_are_named(audit, rel):
    r = audit(rel, "light")
    bad = [f"widget {c['widget']} control {c['control']} ({c['kind']}): named {c['name']!r}, "
           f"labelled {c['label']!r} on the page" for c in r["controls"]
           if not c["label"] or c["name"] != c["label"]]
    bad += [f"widget {f['widget']}: a frame ({f['kind']}) has no text alternative"
            for f in r["frames"] if not f["name"]]
    bad += [f"widget {f['widget']}: an SVG frame is not role=img" for f in r["frames"]
            if f["kind"] == "svg" and f.get("role") != "img"]
    assert not bad, f"{rel}:\n  " + "\n  ".join(bad)
    if rel in WIDGET_PAGES:
        assert r["controls"] and r["frames"], f"{rel}: no rendered widget found"


# --- math a screen reader can read ----------------------------------------------------------------


@pytest.mark.site
@pytest.mark.parametrize("rel", PAGES)
def test_math_has_assistive_mathml(audit, rel):
    m = audit(rel, "light")["math"]
    assert not m["missing"], f"{rel}: equations without assistive MathML: {m['missing'][:5]}"
    if m["containers"]:
        assert m["assistive"] == m["containers"]
        assert m["setting"] is True, f"{rel}: MathJax's assistiveMml setting is {m['setting']!r}, not on"


# --- the keyboard ----------------------------------------------------------------------------------


def _wait_frame_change(page, widget: int, before: str, timeout_ms: int = 5000) -> str:
    waited = 0
    while waited < timeout_ms:
        now = a11y.visible_frame(page, widget)
        if now != before:
            return now
        page.wait_for_timeout(50)
        waited += 50
    return before


def keyboard_walk(page, widget: int) -> list[str]:
    """Keyboard only: Tab from the top of the page to the widget's first control; on each
    control an arrow key moves the value (Right, or Down in a select; the other way at the
    end of its range) and the frame changes, the opposite arrow brings the frame back; Tab
    moves on to the next control (a row of toggle buttons is one tab stop). Returns what
    went wrong."""
    walk = a11y.tab_to_widget(page, widget)
    if not (walk[-1] and walk[-1]["widget"] == widget and walk[-1]["control"] == 0):
        return [(f"{len(walk)} presses of Tab never reached widget {widget}; the last stops: "
                 f"{[w and (w['tag'], w['text'][:20]) for w in walk[-6:]]}")]
    controls = a11y.control_names(page, widget=widget)
    problems = []
    for c, info in enumerate(controls):
        here = a11y.focused(page)
        if not (here and here["widget"] == widget and here["control"] == c):
            return problems + [f"widget {widget}: Tab went to {here}, not to control {c}"]
        if not here["name"]:
            problems.append(f"widget {widget} control {c} has the focus but no accessible name: {here}")
        up, down = ("ArrowDown", "ArrowUp") if info["kind"] == "dropdown" else ("ArrowRight", "ArrowLeft")
        if info["kind"] != "toggle" and info["index"] == info["count"] - 1:
            up, down = down, up                     # at the end of its range: go back first
        first, value = a11y.visible_frame(page, widget), here["value"]
        page.keyboard.press(up)
        moved = _wait_frame_change(page, widget, first)
        after = a11y.focused(page)
        if moved == first:
            problems.append(f"widget {widget} control {c} ({info['kind']} {info['label']!r}): "
                            f"{up} did not change the frame")
        elif not (after and after["control"] == c and after["value"] != value):
            problems.append(f"widget {widget} control {c}: after {up} the focus or the value "
                            f"did not follow: {here} -> {after}")
        page.keyboard.press(down)
        if moved != first and _wait_frame_change(page, widget, moved) != first:
            problems.append(f"widget {widget} control {c}: {down} did not bring the first frame back")
        if c + 1 < len(controls):
            page.keyboard.press("Tab")
    return problems


@pytest.mark.site
@pytest.mark.parametrize("rel", WIDGET_PAGES)
def test_keyboard_walk_through_a_widget(book, browser, rel):
    """The first widget of every chapter that has widgets, from the keyboard alone."""
    context, page, _ = sitecheck.open_page(browser, book, rel)
    try:
        problems = keyboard_walk(page, 0)
        assert a11y.control_names(page, widget=0), f"{rel}: no widget controls found"
    finally:
        context.close()
    assert not problems, f"{rel}:\n  " + "\n  ".join(problems)


@pytest.mark.site
def test_demo_widgets_of_every_kind(demo_site, browser):
    """test_site's demo book holds widgets of every kind static_widget makes (toggle
    buttons, slider, dropdown; SVG frames without a <title>, PNG frames): no axe violation,
    every control named by its label, every frame named, each widget works from the keyboard.
    (The demo book has none of the book's template overrides: axe looks at the widgets only.)"""
    context, page, _ = sitecheck.open_page(browser, demo_site, "good.html")
    try:
        violations = a11y.run_axe(page, within=".normcore-widget")  # the theme is checked on the book
        controls = a11y.control_names(page)
        frames = a11y.frame_names(page)
        walks = {w: keyboard_walk(page, w) for w in sorted({c["widget"] for c in controls})}
    finally:
        context.close()
    assert not violations, "\n".join(a11y.format_violations(violations))
    assert {c["kind"] for c in controls} == {"toggle", "slider", "dropdown"}, controls
    assert all(c["name"] == c["label"] != "" for c in controls), controls
    assert {f["kind"] for f in frames} == {"svg", "img"} and all(f["name"] for f in frames), frames
    assert len(walks) == 3 and not any(walks.values()), walks


# --- the checks themselves catch what they must ----------------------------------------------------


@pytest.mark.site
def test_axe_catches_a_broken_page(book, browser):
    """An image without alt text, an unnamed slider and grey-on-grey text, added to a real
    page: axe must report each."""
    context, page, _ = sitecheck.open_page(browser, book, PAGES[0])
    try:
        page.evaluate("""() => {
            const main = document.querySelector('main') || document.body;
            main.insertAdjacentHTML('afterbegin',
                '<img src="_static/logo.svg" width="20" height="20">'
                + '<div role="slider" tabindex="0" aria-valuenow="1" aria-valuemin="0" aria-valuemax="2"></div>'
                + '<p style="color:#999;background:#aaa">faint text</p>');
        }""")
        rules = a11y.count_by_rule(a11y.run_axe(page))
    finally:
        context.close()
    assert {"image-alt", "aria-input-field-name", "color-contrast"} <= set(rules), rules
