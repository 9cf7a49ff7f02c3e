/* normcore book, site check: the page's favicon, fetched. Returns {href, status, type}
 * (all null when the page links no icon).
 */
async () => {
    const link = document.querySelector('link[rel~="icon"]');
    if (!link) return {href: null, status: null, type: null};
    const r = await fetch(link.href);
    return {href: link.getAttribute('href'), status: r.status,
            type: r.headers.get('content-type')};
}
