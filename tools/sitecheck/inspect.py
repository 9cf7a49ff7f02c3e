"""What a page shows, inspected: its math, images (loaded, at their aspect ratio, with alt
text), favicon, download links, widgets, what sticks out of the column, the contrast of its
text, and the lines of its visible text that match a pattern. Each function reports what it
saw and asserts nothing.
"""

from __future__ import annotations

from .loading import IS_RENDERED_JS, VIEWS_JS, WIDGET_STATE


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

