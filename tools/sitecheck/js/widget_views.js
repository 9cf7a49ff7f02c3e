/* normcore book, site check: the page's widget views. Returns an array of its
 * <script type="application/vnd.jupyter.widget-view+json"> elements (sitecheck.WIDGET_VIEW),
 * in document order: the widget manager renders each widget just before its view's script.
 */
() => Array.from(document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]'))
