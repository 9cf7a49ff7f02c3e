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
 * The page's widget state (the frames: up to 1.5 MB) is not in the page either:
 * assets/sphinx_ext/normcore_widget_state.py moved it to <page>.widget-state.js at build time
 * (after the math in its captions was typeset, assets/sphinx_ext/normcore_math.py) and left
 * its script empty (data-normcore-src names the file). The loader loads it alongside
 * embed.js and puts it back into the script.
 *
 * embed.js renders every widget of the page on the window's load event. Added after that
 * event, it would wait for it forever: while it runs, a "load" listener it adds is called
 * once the page has loaded (at once if it already has, as jQuery's ready() does) and the
 * state is in place.
 *
 * Widgets rendered late show their captions' math as typeset at build time (no MathJax runs
 * on the page) and get their accessible names and arrow keys (normcore-a11y.js watches the
 * page for new controls).
 */
(function () {
  "use strict";
  var VIEWS = 'script[type="application/vnd.jupyter.widget-view+json"]';
  var me = document.currentScript;
  var src = me && me.src ? new URL(me.getAttribute("data-embed") || "html-manager/embed.js", me.src).href : null;
  var started = false;

  // the widget state, moved out of the page by normcore_widget_state.py into a script
  // (<page>.widget-state.js, which works from file:// too): loaded and put back into its
  // (empty) script element before embed.js reads it
  function loadState() {
    var scripts = document.querySelectorAll('script[type="application/vnd.jupyter.widget-state+json"][data-normcore-src]');
    return Promise.all(Array.prototype.map.call(scripts, function (s) {
      if (s.textContent.trim()) return null;
      var name = s.getAttribute("data-normcore-src");
      return new Promise(function (resolve) {
        var js = document.createElement("script");
        js.src = new URL(name, document.baseURI).href;
        js.onload = function () {
          var all = window.normcoreWidgetState || {};
          if (all[name]) s.textContent = JSON.stringify(all[name]);
          else console.error("normcore: " + name + " holds no widget state");
          delete all[name];
          resolve();
        };
        js.onerror = function () {
          console.error("normcore: the widget state " + name + " did not load");
          resolve();
        };
        document.head.appendChild(js);
      });
    }));
  }

  function load() {
    if (started || !src) return;
    started = true;
    var state = loadState();
    var loaded = document.readyState === "complete" ? Promise.resolve() : new Promise(function (resolve) {
      window.addEventListener("load", resolve);
    });
    var add = window.addEventListener;
    window.addEventListener = function (type, listener) {
      if (type === "load" && typeof listener === "function") {
        // after the page's load event and once the state is in place
        loaded.then(function () { return state; }).then(function () {
          listener.call(window, new Event("load"));
        });
        return;
      }
      return add.apply(this, arguments);
    };
    var done = function () { delete window.addEventListener; };
    var s = document.createElement("script");
    s.src = src;
    s.onload = done;
    s.onerror = done;
    // embed.js brings Font Awesome 5's CSS, whose ".fas" would take the theme's own icons
    // (download, full screen: Font Awesome 6 names them .fas too) and fetch a second icon
    // font; outside widgets they keep the theme's (a more specific rule, so before it)
    var style = document.createElement("style");
    style.textContent = '.fas:not(.jupyter-widgets *), .fa-solid:not(.jupyter-widgets *) ' +
      '{ font-family: "Font Awesome 6 Free"; }';
    document.head.appendChild(style);
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
