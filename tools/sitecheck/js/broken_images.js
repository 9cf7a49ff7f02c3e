/* normcore book, site check: the images that do not load. Returns the src of every <img>
 * of the page that has no picture once loaded (naturalWidth 0).
 *
 * uses: load_images
 */
(loadImages) => async () => {
    const imgs = Array.from(document.images);
    await loadImages(imgs);
    return imgs.filter(img => !(img.complete && img.naturalWidth > 0))
               .map(img => img.getAttribute('src'));
}
