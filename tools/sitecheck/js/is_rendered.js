/* normcore book, site check: whether a widget view (its script element, `s`) has been
 * rendered. Returns true once the widget manager has put the widget in a .widget-subarea
 * just before the view's script.
 */
(s) => {
    const p = s.previousElementSibling;
    return !!(p && p.classList.contains('widget-subarea') && p.querySelector('.jupyter-widgets'));
}
