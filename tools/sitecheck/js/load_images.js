/* normcore book, site check: load the images `imgs` now, lazy ones too. Returns a promise
 * that resolves once each image has loaded or failed, or has waited 5 s.
 */
(imgs) => {
    for (const img of imgs) { img.loading = 'eager'; }
    return Promise.all(imgs.map(img => img.complete ? null :
        new Promise(r => { img.onload = img.onerror = r; setTimeout(r, 5000); })));
}
