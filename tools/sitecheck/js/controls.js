/* normcore book, site check: the controls of a widget (the element `root`): its selects,
 * toggle buttons and slider handles, each marked data-nc-ctl="<its index>". Returns
 * [{kind, n, index}, ...]: "select", "toggle" or "slider", how many values, the current one.
 */
(root) => {
    const found = Array.from(root.querySelectorAll('select, .widget-toggle-buttons, .noUi-handle'));
    return found.map((el, i) => {
        el.setAttribute('data-nc-ctl', String(i));
        if (el.tagName === 'SELECT')
            return {kind: 'select', n: el.options.length, index: el.selectedIndex};
        if (el.classList.contains('widget-toggle-buttons')) {
            const b = Array.from(el.querySelectorAll('button'));
            return {kind: 'toggle', n: b.length, index: b.findIndex(x => x.classList.contains('mod-active'))};
        }
        const max = Math.round(parseFloat(el.getAttribute('aria-valuemax')));
        const min = Math.round(parseFloat(el.getAttribute('aria-valuemin')));
        const now = Math.round(parseFloat(el.getAttribute('aria-valuenow')));
        return {kind: 'slider', n: max - min + 1, index: now - min};
    });
}
