/* normcore book, site check: how large the text inside each widget's shown frame, and inside
 * each figure of a cell's output, is on this screen, in CSS px. page.evaluate() calls this
 * function; it returns one entry per frame layout or figure on screen: {widget, kind, px, what}
 * (widget: the widget's index, or "figure").
 *
 * An SVG frame: the smallest computed font size of its <text>/<tspan> elements, times the
 * scale its viewBox is drawn at. A raster frame (a matplotlib figure): its <img> carries the
 * smallest text size of the figure as drawn (data-text-px, at the widget's dpi) and the pixel
 * density it was drawn at (data-density); the size on screen is that, times the displayed
 * width over the image's own width in CSS px (normcore.widgets writes both attributes, and
 * the book's extension normcore_figures writes them on a figure's <picture>). A figure's <img>
 * also names its phone layout's file (data-narrow) and that layout's smallest text
 * (data-narrow-text-px): the layout the browser chose is measured by its own text.
 * An image without data-text-px is reported with px null: its text cannot be measured.
 * A layout that is not shown (display: none, a Stack's other frames) has no box and is skipped.
 */
() => {
  const out = [];
  // a raster frame or a figure: its text size as drawn, times the scale it is shown at
  const measure = (img, where) => {
    const r = img.getBoundingClientRect();
    if (!r.width) return;          // not shown: a Stack's other frame, the other layout
    const name = (img.currentSrc || img.src).split("/").pop();
    if (!img.naturalWidth) {       // shown, and not loaded: its text cannot be measured
      out.push({ widget: where, kind: "img", px: null, what: "not loaded: " + name.slice(0, 50) });
      return;
    }
    if (!img.dataset.textPx) {   // raw image bytes, a figure without a phone layout, or an old build
      out.push({ widget: where, kind: "img", px: null, what: "no data-text-px: " + name.slice(0, 50) });
      return;
    }
    const own = img.naturalWidth / parseFloat(img.dataset.density || "1");
    const narrowShown = !!img.dataset.narrow && name === img.dataset.narrow;
    const drawn = narrowShown ? img.dataset.narrowTextPx : img.dataset.textPx;
    const px = parseFloat(drawn) * (r.width / own);
    out.push({ widget: where, kind: "img", px: Math.round(px * 100) / 100, what: name.slice(0, 70) });
  };
  // an SVG drawn in the page: its smallest font, times the scale its viewBox is drawn at
  const measureSvg = (svg, where) => {
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
      out.push({ widget: where, kind: "svg", px: Math.round(min * 100) / 100,
                 what: (title ? title.textContent : svg.getAttribute("aria-label") || "").slice(0, 70) });
    }
  };
  const widgets = document.querySelectorAll(".normcore-widget");
  widgets.forEach((w, wi) => {
    w.querySelectorAll(".normcore-frame svg").forEach((svg) => measureSvg(svg, wi));
    w.querySelectorAll(".normcore-frame img").forEach((img) => measure(img, wi));
  });
  // the chapters' figures (cell outputs; normcore.images.responsive_figure makes them a
  // <picture> with data-text-px): every image of a cell's output that is not a widget's
  document.querySelectorAll("div.cell_output img").forEach((img) => {
    if (!img.closest(".normcore-widget")) measure(img, "figure");
  });
  document.querySelectorAll("div.cell_output svg").forEach((svg) => {
    if (!svg.closest(".normcore-widget")) measureSvg(svg, "figure");
  });
  return out;
}
