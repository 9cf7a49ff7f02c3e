/* normcore book, site check: whether every widget view of the page has been rendered.
 * page.wait_for_function() polls this function; it returns true or false.
 *
 * uses: widget_views is_rendered
 */
(widgetViews, isRendered) => () => widgetViews().every(isRendered)
