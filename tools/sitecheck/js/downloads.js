/* normcore book, site check: the page's download links (to _sources/), each fetched.
 * Returns [{href, status, bytes}, ...].
 */
async () => {
    const links = Array.from(document.querySelectorAll('a[href*="_sources/"]'));
    const out = [];
    for (const a of links) {
        const r = await fetch(a.href);
        out.push({href: a.getAttribute('href'), status: r.status, bytes: (await r.arrayBuffer()).byteLength});
    }
    return out;
}
