/* normcore book, site check: the contrast of the text of every element matching `selector`.
 * Returns [{selector, ratio, color, background, text}, ...], one per visible element.
 */
(selector) => {
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
}
