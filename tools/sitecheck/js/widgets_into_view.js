/* normcore book, site check: bring each widget into view once, then go back to where the
 * page was. Returns nothing.
 *
 * uses: widget_views
 */
(widgetViews) => async () => {
    // the widget manager loads when a widget comes near the viewport (normcore-widgets.js):
    // bring each widget into view once, then go back to the top
    const views = widgetViews();
    if (!views.length) return;
    const y = window.scrollY;
    for (const v of views) {
        if (!v.parentElement) continue;
        v.parentElement.scrollIntoView({block: 'center'});
        await new Promise(r => requestAnimationFrame(() => setTimeout(r, 50)));
    }
    window.scrollTo(0, y);
}
