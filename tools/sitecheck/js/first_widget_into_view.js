/* normcore book, site check: scroll the page's first widget into the middle of the screen
 * and wait until it renders. Returns {t0, rendered} (performance.now() at the scroll and at
 * the render; rendered is NaN after 30 s), or null for a page without widgets.
 *
 * uses: widget_views is_rendered
 */
(widgetViews, isRendered) => async () => {
    // scroll the first widget into the middle of the screen; milliseconds until it renders
    const v = widgetViews()[0];
    if (!v) return null;
    v.parentElement.scrollIntoView({block: 'center'});
    const t0 = performance.now();
    while (!isRendered(v)) {
        if (performance.now() - t0 > 30000) return {t0, rendered: NaN};
        await new Promise(r => setTimeout(r, 5));
    }
    return {t0, rendered: performance.now()};
}
