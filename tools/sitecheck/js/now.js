/* normcore book, site check: the page's clock. Returns performance.now(), in milliseconds
 * since navigation start.
 */
() => performance.now()
