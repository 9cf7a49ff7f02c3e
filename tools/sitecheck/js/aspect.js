/* normcore book, site check: images of the article shown at another aspect ratio than their
 * own, by more than `tol` (relative). Returns [{src, natural, shown}, ...].
 *
 * uses: load_images
 */
(loadImages) => async (tol) => {
    const imgs = Array.from(document.querySelectorAll('article img'));
    await loadImages(imgs);
    const bad = [];
    for (const img of imgs) {
        // the content box: dark mode puts padding (a light card) around a figure
        const r = img.getBoundingClientRect(), cs = getComputedStyle(img);
        const px = k => parseFloat(cs[k]) || 0;
        const w = r.width - px('paddingLeft') - px('paddingRight')
                  - px('borderLeftWidth') - px('borderRightWidth');
        const h = r.height - px('paddingTop') - px('paddingBottom')
                  - px('borderTopWidth') - px('borderBottomWidth');
        if (!img.naturalWidth || !img.naturalHeight || w < 2 || h < 2) continue;
        const natural = img.naturalWidth / img.naturalHeight;
        const shown = w / h;
        if (Math.abs(shown / natural - 1) > tol)
            bad.push({src: (img.getAttribute('src') || '').slice(0, 80),
                      natural: +natural.toFixed(3), shown: +shown.toFixed(3)});
    }
    return bad;
}
