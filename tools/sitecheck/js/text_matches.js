/* normcore book, site check: the lines of the page's visible text that match the regular
 * expression `pat`. Returns each such line, trimmed, at most 120 characters of it.
 */
(pat) => document.body.innerText.split('\n').filter(l => new RegExp(pat).test(l))
              .map(l => l.trim().slice(0, 120))
