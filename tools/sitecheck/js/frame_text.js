/* normcore book, site check: how large the text inside each widget's shown frame is on this
 * screen, in CSS px. page.evaluate() calls this function; it returns one entry per frame
 * layout on screen: {widget, kind, px, what}.
 *
 * An SVG frame: the smallest computed font size of its <text>/<tspan> elements, times the
 * scale its viewBox is drawn at. A raster frame (a matplotlib figure): its <img> carries the
 * smallest text size of the figure as drawn (data-text-px, at the widget's dpi) and the pixel
 * density it was drawn at (data-density); the size on screen is that, times the displayed
 * width over the image's own width in CSS px (normcore.widgets writes both attributes).
 * An image without data-text-px is reported with px null: its text cannot be measured.
 * A layout that is not shown (display: none, a Stack's other frames) has no box and is skipped.
 */
() => {
  const out = [];
  const widgets = document.querySelectorAll(".normcore-widget");
  widgets.forEach((w, wi) => {
    w.querySelectorAll(".normcore-frame svg").forEach((svg) => {
      const r = svg.getBoundingClientRect();
      if (!r.width || !r.height) return;
      const vb = svg.viewBox && svg.viewBox.baseVal;
      const k = vb && vb.width ? r.width / vb.width : 1;
      let min = Infinity;
      svg.querySelectorAll("text, tspan").forEach((t) => {
        if (!t.textContent.trim()) return;
        const px = parseFloat(getComputedStyle(t).fontSize) * k;
        if (px < min) min = px;
      });
      if (min < Infinity) {
        const title = svg.querySelector("title");
        out.push({ widget: wi, kind: "svg", px: Math.round(min * 100) / 100,
                   what: (title ? title.textContent : svg.getAttribute("aria-label") || "").slice(0, 70) });
      }
    });
    w.querySelectorAll(".normcore-frame img").forEach((img) => {
      const r = img.getBoundingClientRect();
      if (!r.width || !img.naturalWidth) return;
      if (!img.dataset.textPx) {   // raw image bytes, or a build from before the attribute
        out.push({ widget: wi, kind: "img", px: null,
                   what: "no data-text-px: " + (img.currentSrc || img.src).split("/").pop().slice(0, 50) });
        return;
      }
      const own = img.naturalWidth / parseFloat(img.dataset.density || "1");
      const px = parseFloat(img.dataset.textPx) * (r.width / own);
      out.push({ widget: wi, kind: "img", px: Math.round(px * 100) / 100,
                 what: (img.currentSrc || img.src).split("/").pop().slice(0, 70) });
    });
  });
  return out;
}
