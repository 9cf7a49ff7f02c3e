/* normcore book: load the widget manager only when a widget is about to be seen.
 *
 * A page with widgets carries their state (the frames) in its HTML; what renders them is
 * @jupyter-widgets/html-manager's embed.js, 1.9 MB of script. myst-nb puts this loader on
 * those pages instead (nb_ipywidgets_js in _config.yml, with data-embed = embed.js's path
 * under _static/), and the loader adds embed.js to the page the first time a widget comes
 * within one screen height of the viewport (IntersectionObserver), or when the page is
 * printed. The first screen of a chapter never waits for the widget manager, and a reader
 * who does not scroll to a widget never downloads it.
 *
 * embed.js renders every widget of the page on the window's load event. Added after that
 * event, it would wait for it forever: while it runs, a "load" listener added to a page
 * that has already loaded is called at once instead (as jQuery's ready() does).
 *
 * Widgets rendered late still get their math typeset (normcore-mathjax-shim.js gives
 * ipywidgets MathJax 3, for whenever a widget asks) and their accessible names and arrow
 * keys (normcore-a11y.js watches the page for new controls).
 */
(function () {
  "use strict";
  var VIEWS = 'script[type="application/vnd.jupyter.widget-view+json"]';
  var me = document.currentScript;
  var src = me && me.src ? new URL(me.getAttribute("data-embed") || "html-manager/embed.js", me.src).href : null;
  var started = false;

  function load() {
    if (started || !src) return;
    started = true;
    var add = window.addEventListener;
    window.addEventListener = function (type, listener) {
      if (type === "load" && document.readyState === "complete" && typeof listener === "function") {
        setTimeout(function () { listener.call(window, new Event("load")); }, 0);
        return;
      }
      return add.apply(this, arguments);
    };
    var done = function () { delete window.addEventListener; };
    var s = document.createElement("script");
    s.src = src;
    s.onload = done;
    s.onerror = done;
    document.head.appendChild(s);
  }

  function start() {
    var views = document.querySelectorAll(VIEWS);
    if (!views.length) return;
    if (!("IntersectionObserver" in window)) { load(); return; }
    // a view script is never laid out; its output box is (empty until the widget renders)
    var io = new IntersectionObserver(function (entries) {
      if (entries.some(function (e) { return e.isIntersecting; })) {
        io.disconnect();
        load();
      }
    }, { rootMargin: "100% 0px 100% 0px" });
    Array.prototype.forEach.call(views, function (v) { if (v.parentElement) io.observe(v.parentElement); });
    window.addEventListener("beforeprint", load);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
