"""Accessibility checks of a built book page: axe-core, colour modes, the keyboard.

Used by tests/test_a11y.py (which asserts) together with tools/sitecheck/ (the local
server, the browser, page loading). Nothing here asserts; every function reports.

axe-core is the accessibility engine, pinned in package.json (a dev dependency, installed
by `npm ci` into node_modules/). Its source is injected into the page under test as an
inline script (Playwright's add_script_tag(path=...)): it is never fetched from anywhere
and never part of the built site.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AXE_JS = ROOT / "node_modules" / "axe-core" / "axe.min.js"
#: The WCAG 2.1 level A and AA rules of axe-core.
WCAG21_AA = ("wcag2a", "wcag2aa", "wcag21a", "wcag21aa")
MODES = ("light", "dark")


def axe_version() -> str:
    return json.loads((AXE_JS.parent / "package.json").read_text(encoding="utf-8"))["version"]


# --- axe -----------------------------------------------------------------------------------------


def run_axe(page, tags=WCAG21_AA, within: str | None = None) -> list[dict]:
    """Run axe-core with the rules of `tags` on the whole page (or on the elements matching
    the CSS selector `within`); return its violations, each
    {rule, impact, help, url, nodes: [{target, html, summary}]}."""
    if not AXE_JS.is_file():
        raise FileNotFoundError(f"{AXE_JS} is missing: run `npm ci` (axe-core is pinned in package.json)")
    if not page.evaluate("() => !!window.axe"):
        page.add_script_tag(path=str(AXE_JS))
    return page.evaluate(
        """async ([tags, within]) => {
            const r = await axe.run(within ? {include: [within]} : document,
                                    {runOnly: {type: 'tag', values: tags}, resultTypes: ['violations']});
            return r.violations.map(v => ({
                rule: v.id, impact: v.impact, help: v.help, url: v.helpUrl,
                nodes: v.nodes.map(n => ({target: n.target.map(String).join(' '),
                                          html: n.html.slice(0, 200),
                                          summary: (n.failureSummary || '').replace(/\\s+/g, ' ').trim()})),
            }));
        }""",
        [list(tags), within],
    )


def format_violations(violations: list[dict], where: str = "") -> list[str]:
    """One readable line per violating node: rule, impact, target, summary."""
    out = []
    for v in violations:
        for n in v["nodes"]:
            out.append(f"{where}{v['rule']} ({v['impact']}): {n['target']}: {v['help']}. {n['summary']}")
    return out


def count_by_rule(violations: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in violations:
        counts[v["rule"]] = counts.get(v["rule"], 0) + len(v["nodes"])
    return counts


# --- the static widgets' frames -------------------------------

_FRAMES_JS = """() => {
    const out = [];
    document.querySelectorAll('.normcore-widget').forEach((w, k) => {
        w.querySelectorAll('.normcore-frame').forEach((f, j) => {
            const imgs = f.matches('img') ? [f] : Array.from(f.querySelectorAll('img'));
            for (const img of imgs)
                out.push({widget: k, frame: j, kind: 'img', name: (img.getAttribute('alt') || '').trim()});
            for (const svg of f.querySelectorAll('svg')) {
                if (svg.parentElement.closest('svg')) continue;   // nested <svg>
                const t = svg.querySelector(':scope > title');
                out.push({widget: k, frame: j, kind: 'svg', role: svg.getAttribute('role'),
                          name: ((svg.getAttribute('aria-label') || '') || (t ? t.textContent : '')).trim()});
            }
        });
    });
    return out;
}"""


def frame_names(page) -> list[dict]:
    """Every frame of every static widget that is in the page (ipywidgets' Stack renders
    the selected child only): its image's alt text, or its SVG's accessible name
    (aria-label or <title>) and role. tests/test_widgets.py checks every frame in Python."""
    return page.evaluate(_FRAMES_JS)


# --- math --------------------------------------------------------------------------------------------


def math_speech(page) -> dict:
    """MathJax's output for screen readers: each mjx-container should hold an
    mjx-assistive-mml with a MathML <math> (the visual part is aria-hidden). `setting` is the
    assistiveMml option the build typeset the page with (its math stylesheet's
    data-assistive-mml, assets/sphinx_ext/normcore_math.py), None on a page without math."""
    return page.evaluate(
        """() => {
            const all = Array.from(document.querySelectorAll('mjx-container'));
            const ok = all.filter(c => c.querySelector(':scope > mjx-assistive-mml > math'));
            const built = document.getElementById('normcore-math');
            const setting = built ? built.getAttribute('data-assistive-mml') === 'true' : null;
            return {containers: all.length, assistive: ok.length, setting,
                    missing: all.filter(c => !ok.includes(c)).map(c => c.textContent.slice(0, 60))};
        }"""
    )


# --- the keyboard ----------------------------------------------------------------------------------

_NAME_JS = """
    const textOf = id => { const e = document.getElementById(id); return e ? e.textContent.trim() : ''; };
    const nameOf = e => {
        if (!e) return '';
        const by = e.getAttribute('aria-labelledby');
        if (by) return by.split(/\\s+/).map(textOf).join(' ').trim();
        const al = e.getAttribute('aria-label');
        if (al) return al.trim();
        if (e.tagName === 'BUTTON') return e.textContent.trim();
        return '';
    };
    const kindOf = ctl => ctl.classList.contains('widget-toggle-buttons') ? 'toggle'
        : ctl.querySelector('.noUi-handle') ? 'slider' : ctl.querySelector('select') ? 'dropdown' : 'other';
    const focusTarget = ctl => ({toggle: ctl.querySelector('[role=radiogroup]'),
        slider: ctl.querySelector('.noUi-handle'), dropdown: ctl.querySelector('select')})[kindOf(ctl)];
    const positionOf = ctl => {
        const k = kindOf(ctl);
        if (k === 'toggle') { const b = Array.from(ctl.querySelectorAll('button'));
                              return [b.findIndex(x => x.classList.contains('mod-active')), b.length]; }
        if (k === 'slider') { const h = ctl.querySelector('.noUi-handle'),
                                    g = a => Math.round(parseFloat(h.getAttribute(a)));
                              return [g('aria-valuenow') - g('aria-valuemin'),
                                      g('aria-valuemax') - g('aria-valuemin') + 1]; }
        if (k === 'dropdown') { const s = ctl.querySelector('select');
                                return [s.selectedIndex, s.options.length]; }
        return [null, null];
    };
    const valueOf = ctl => {
        const k = kindOf(ctl);
        if (k === 'toggle') { const b = ctl.querySelector('button.mod-active');
                              return b ? b.textContent.trim() : null; }
        if (k === 'slider') { const h = ctl.querySelector('.noUi-handle');
                              return h.getAttribute('aria-valuetext') || h.getAttribute('aria-valuenow'); }
        if (k === 'dropdown') { const s = ctl.querySelector('select');
                                return s.selectedIndex >= 0 ? s.options[s.selectedIndex].text : null; }
        return null;
    };
"""

_CONTROL_NAMES_JS = "(only) => {" + _NAME_JS + """
    const out = [];
    document.querySelectorAll('.normcore-widget').forEach((w, k) => {
        if (only !== null && k !== only) return;
        w.querySelectorAll('.normcore-control').forEach((ctl, c) => {
            const label = ctl.querySelector(':scope > label.widget-label');
            out.push({widget: k, control: c, kind: kindOf(ctl), label: label ? label.textContent.trim() : '',
                      name: nameOf(focusTarget(ctl)), value: valueOf(ctl),
                      index: positionOf(ctl)[0], count: positionOf(ctl)[1]});
        });
    });
    return out;
}"""

_ACTIVE_JS = "() => {" + _NAME_JS + """
    const a = document.activeElement;
    if (!a || a === document.body) return null;
    const w = a.closest('.normcore-widget');
    const ctl = a.closest('.normcore-control');
    return {
        tag: a.tagName.toLowerCase(), role: a.getAttribute('role'),
        widget: w ? Array.from(document.querySelectorAll('.normcore-widget')).indexOf(w) : -1,
        control: ctl && w ? Array.from(w.querySelectorAll('.normcore-control')).indexOf(ctl) : -1,
        name: nameOf(a), group: ctl ? nameOf(focusTarget(ctl)) : null, value: ctl ? valueOf(ctl) : null,
        text: (a.textContent || '').trim().slice(0, 80),
    };
}"""


def control_names(page, widget: int | None = None) -> list[dict]:
    """Every control of the static widgets (or of widget number `widget`): its kind, its
    visible label, the accessible name of what takes the focus (the slider's handle, the
    radio group of toggle buttons, the select), and its current value."""
    return page.evaluate(_CONTROL_NAMES_JS, widget)


_VISIBLE_FRAME_JS = """(w) => {
    const widget = document.querySelectorAll('.normcore-widget')[w];
    const visible = e => !!(e.offsetWidth || e.offsetHeight || e.getClientRects().length);
    const shown = Array.from(widget.querySelectorAll('.normcore-frame')).filter(visible);
    return shown.map(f => {
        const img = f.querySelector('img'), svg = f.querySelector('svg');
        const t = svg && svg.querySelector(':scope > title');
        return img ? 'img:' + img.getAttribute('alt') + ':' + img.getAttribute('src').length + ':' + img.src.slice(-64)
                   : 'svg:' + (svg && (svg.getAttribute('aria-label') || (t && t.textContent)));
    }).join('|');
}"""


def focused(page) -> dict | None:
    """Where the keyboard focus is: tag, role, accessible label, and which widget/control."""
    return page.evaluate(_ACTIVE_JS)


def visible_frame(page, widget: int) -> str:
    """A signature of the frame that widget `widget` shows (its alt text / SVG name and image)."""
    return page.evaluate(_VISIBLE_FRAME_JS, widget)


def tab_to_widget(page, widget: int = 0, max_tabs: int = 400) -> list[dict]:
    """Press Tab from the top of the page until the focus lands on a control of static widget
    number `widget`; return the focus after each press (the last one inside the widget, or
    the whole walk if it never got there)."""
    page.evaluate("() => { document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0); }")
    page.keyboard.press("Tab")
    walk = [focused(page)]
    while len(walk) < max_tabs:
        f = walk[-1]
        if f is not None and f["widget"] == widget and f["control"] >= 0:
            break
        page.keyboard.press("Tab")
        walk.append(focused(page))
    return walk
