/* normcore book: on a narrow screen, scale each display equation that is wider than its
 * column down until it fits (MathJax 3 has no automatic line breaking). On wide screens the
 * equations are written to fit (tests/test_site.py checks it at 1280 px), so nothing is
 * scaled there. Runs after MathJax's first typeset and again on resize.
 */
(function () {
  "use strict";
  var NARROW = 768; // px of viewport below which equations may be scaled

  var wasNarrow = false;
  function fit() {
    var narrow = window.innerWidth < NARROW;
    if (!narrow && !wasNarrow) return;
    wasNarrow = narrow;
    var eqs = document.querySelectorAll('mjx-container[display="true"]');
    for (var i = 0; i < eqs.length; i++) {
      var eq = eqs[i];
      eq.style.fontSize = "";
      if (!narrow) continue;
      var math = eq.querySelector("mjx-math");
      var box = eq.parentElement;
      if (!math || !box) continue;
      var need = math.getBoundingClientRect().width;
      var have = box.clientWidth - 2;
      if (need > have && need > 0) {
        eq.style.fontSize = Math.floor((100 * have) / need) + "%";
      }
    }
  }

  // label each table cell with its column's header, for the one-card-per-row layout of
  // narrow screens (normcore.css)
  function labelTables() {
    var tables = document.querySelectorAll("article table.table");
    for (var t = 0; t < tables.length; t++) {
      var heads = tables[t].querySelectorAll("thead th");
      var rows = tables[t].querySelectorAll("tbody tr");
      for (var r = 0; r < rows.length; r++) {
        var cells = rows[r].children;
        for (var c = 0; c < cells.length && c < heads.length; c++) {
          var label = heads[c].textContent.trim()
            .replace(/\\\(|\\\)/g, "")
            .replace(/\\[lr]vert\s*/g, "|")
            .replace(/\\[a-zA-Z]+\s*/g, "")
            .replace(/[{}]/g, "");
          if (label) cells[c].setAttribute("data-label", label);
        }
      }
    }
  }

  function start() {
    labelTables();
    var mj = window.MathJax;
    var ready = mj && mj.startup && mj.startup.promise ? mj.startup.promise : Promise.resolve();
    ready.then(fit);
    var timer = null;
    function later() {
      clearTimeout(timer);
      timer = setTimeout(fit, 60);
    }
    window.addEventListener("resize", later);
    // MathJax typesets lazily, as formulas scroll into view: fit those as they appear
    if (window.MutationObserver) {
      new MutationObserver(function (records) {
        if (window.innerWidth >= NARROW) return;
        for (var i = 0; i < records.length; i++) {
          var added = records[i].addedNodes;
          for (var j = 0; j < added.length; j++) {
            var n = added[j];
            if (n.nodeType === 1 && (n.tagName === "MJX-MATH" || n.querySelector && n.querySelector("mjx-math"))) {
              later();
              return;
            }
          }
        }
      }).observe(document.body, { childList: true, subtree: true });
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
