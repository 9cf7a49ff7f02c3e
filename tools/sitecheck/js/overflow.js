/* normcore book, site check: what is wider than the article column. Returns {items,
 * page_overflow, column}: one {kind, what, by, how} per element too wide (by: how many px),
 * how many px the page itself scrolls sideways (0: none), and the column's width in px.
 */
(phone) => {
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
}
