/* normcore book, site check: figure images of the article without a real text alternative.
 * Returns [{src, alt}, ...] (the end of the src, the start of the alt).
 */
() => {
    // Every figure image of the article (not the theme's logo, not widget frames, whose text
    // alternatives normcore.widgets provides) has alt text that says something: not empty,
    // not a file name or a content hash.
    const bad = [];
    for (const img of document.querySelectorAll('article.bd-article img')) {
        if (img.closest('.jupyter-widgets')) continue;
        const alt = (img.getAttribute('alt') || '').trim();
        const src = img.getAttribute('src') || '';
        const fileish = /\.(png|jpe?g|svg|gif|webp)$/i.test(alt) || /[0-9a-f]{16,}/i.test(alt)
                        || alt === src || alt.split(/\s+/).length < 3;
        if (!alt || fileish) bad.push({src: src.slice(-60), alt: alt.slice(0, 80)});
    }
    return bad;
}
