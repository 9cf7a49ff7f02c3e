/* normcore book: let ipywidgets 8 typeset math with MathJax 3.
 *
 * The HTML and Label views of ipywidgets 8 (in @jupyter-widgets/html-manager's embed.js)
 * call MathJax.Hub.Queue(["Typeset", MathJax.Hub, element]) -- the MathJax 2 API --
 * whenever window.MathJax exists. The book loads MathJax 3, which has no Hub, so every
 * such widget would throw "Cannot read properties of undefined (reading 'Queue')".
 * This maps that call onto MathJax 3's typesetPromise. Loaded with `defer` after
 * tex-chtml.js (html_js_files in _config.yml), i.e. before embed.js renders (on load).
 */
(function () {
  "use strict";
  var mj = window.MathJax;
  if (!mj || mj.Hub) {
    return;
  }
  // The widget views typeset their content before it is attached to the page; MathJax 3
  // finds no math in a detached node, so wait (a few seconds at most) until it is attached.
  function attached(el) {
    return new Promise(function (resolve) {
      var frames = 0;
      (function check() {
        if (el.isConnected || frames++ > 600) {
          resolve();
        } else {
          requestAnimationFrame(check);
        }
      })();
    });
  }
  // One typeset at a time, after MathJax's own first pass over the page.
  var queue = (mj.startup && mj.startup.promise) || Promise.resolve();
  mj.Hub = {
    Queue: function () {
      var elements = [];
      for (var i = 0; i < arguments.length; i++) {
        var job = arguments[i];
        if (Array.isArray(job) && job[0] === "Typeset" && job[2]) {
          elements.push(job[2]);
        }
      }
      if (!elements.length) {
        return;
      }
      queue = queue
        .then(function () {
          return Promise.all(elements.map(attached));
        })
        .then(function () {
          return window.MathJax.typesetPromise(elements.filter(function (el) { return el.isConnected; }));
        })
        .catch(function (err) {
          console.error("normcore: MathJax could not typeset a widget", err);
        });
    },
  };
})();
