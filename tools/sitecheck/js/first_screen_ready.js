/* normcore book, site check: how soon a page is ready to read. Returns performance.now()
 * once every formula is typeset and every widget of the first screen is rendered (and so
 * responds), NaN after 30 s. The widgets further down render when scrolled to
 * (normcore-widgets.js).
 *
 * uses: widget_views is_rendered
 */
(widgetViews, isRendered) => async () => {
    const t0 = Date.now();
    while (Date.now() - t0 < 30000) {
        // every formula typeset (at build time: no MathJax runs on the page)
        const mathOk = Array.from(document.querySelectorAll('.math'))
            .every(e => e.querySelector('mjx-container'));
        // widgets in the first screen (the rest render when scrolled to: normcore-widgets.js)
        const widgetsOk = widgetViews()
            .filter(s => s.parentElement.getBoundingClientRect().top < window.innerHeight)
            .every(isRendered);
        if (mathOk && widgetsOk) return performance.now();
        await new Promise(r => setTimeout(r, 20));
    }
    return NaN;
}
