/* normcore book, site check: the page's widgets. Returns {views, state_scripts, embed_js,
 * unrendered, error_text, raw_json_visible, roots}: the number of widget views, of widget
 * state scripts and of scripts loading the widget manager (embed.js); the indices of the
 * views not rendered; whether the page's text shows a widget error or raw widget JSON; the
 * number of rendered widgets.
 *
 * uses: widget_views is_rendered
 */
(widgetViews, isRendered) => () => {
    const views = widgetViews();
    const unrendered = [];
    views.forEach((s, i) => { if (!isRendered(s)) unrendered.push(i); });
    const text = document.body.innerText;
    return {
        views: views.length,
        state_scripts: document.querySelectorAll('script[type="application/vnd.jupyter.widget-state+json"]').length,
        embed_js: Array.from(document.scripts).filter(s => /html-manager\/embed\.js/.test(s.src)).length,
        unrendered,
        error_text: /Error displaying widget|Error rendering|model not found/i.test(text),
        raw_json_visible: /"model_id"|"version_major"|widget-view\+json|IPY_MODEL_/.test(text),
        roots: document.querySelectorAll('.widget-subarea > .jupyter-widgets').length,
    };
}
