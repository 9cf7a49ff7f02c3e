/* normcore book, site check: the theme's colour mode, `mode` ("light" or "dark"), chosen
 * before the page loads. An init script (context.add_init_script) calls it; it returns
 * nothing.
 *
 * The theme's own switch persists the reader's choice in localStorage "mode" (and "theme"),
 * which pydata-sphinx-theme reads as the page loads.
 */
(mode) => {
    try { localStorage.setItem('mode', mode); localStorage.setItem('theme', mode); } catch (e) {}
}
