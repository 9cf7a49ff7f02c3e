/* normcore book, site check: what a widget (the element `root`) shows. Returns a string,
 * one line per visible part: the HTML of each visible .widget-html-content, the SHA-256 of
 * the bytes of each visible image. Two frames that look different have different
 * signatures.
 */
async (root) => {
    const visible = e => !!(e.offsetWidth || e.offsetHeight || e.getClientRects().length);
    const parts = [];
    for (const e of root.querySelectorAll('.widget-html-content')) {
        if (visible(e)) parts.push('html:' + e.innerHTML);
    }
    for (const img of root.querySelectorAll('img')) {
        if (!visible(img)) continue;
        try {
            const buf = await (await fetch(img.src)).arrayBuffer();
            const d = await crypto.subtle.digest('SHA-256', buf);
            parts.push('img:' + Array.from(new Uint8Array(d)).map(b => b.toString(16).padStart(2, '0')).join(''));
        } catch (err) { parts.push('img-unreadable:' + img.src); }
    }
    return parts.join('\n');
}
