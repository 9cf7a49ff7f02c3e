/* normcore book, site check: scroll from the top to the bottom of the page a screen at a
 * time, as a reader would, then wait (up to 30 s) until every widget is rendered. Returns
 * nothing.
 *
 * uses: widget_views is_rendered
 */
(widgetViews, isRendered) => async () => {
    // scroll down one screen at a time, as a reader would, then wait for every widget
    const step = Math.max(200, window.innerHeight - 100);
    for (let y = 0; y < document.documentElement.scrollHeight; y += step) {
        window.scrollTo(0, y);
        await new Promise(r => requestAnimationFrame(() => setTimeout(r, 50)));
    }
    window.scrollTo(0, document.documentElement.scrollHeight);
    const t0 = Date.now();
    while (!widgetViews().every(isRendered) && Date.now() - t0 < 30000)
        await new Promise(r => setTimeout(r, 50));
}
