/* normcore book: on a narrow screen, scale each display equation that is wider than its
 * column down until it fits (MathJax 3 has no automatic line breaking). On wide screens the
 * equations are written to fit (tests/test_site.py checks it at 1280 px), so nothing is
 * scaled there. The math is typeset when the book is built (assets/sphinx_ext/normcore_math.py),
 * so every equation is on the page at DOMContentLoaded: fitted then, and again on resize.
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
      eq.style.fontSize = ""; // the size the stylesheet gives it
      if (!narrow) continue;
      var math = eq.querySelector("mjx-math");
      var box = eq.parentElement;
      if (!math || !box) continue;
      var need = math.getBoundingClientRect().width;
      // the container's own width: narrower than the column beside an equation number
      var have = Math.min(box.clientWidth, eq.clientWidth || box.clientWidth) - 2;
      if (need > have && need > 0) {
        var px = parseFloat(getComputedStyle(eq).fontSize);
        eq.style.fontSize = Math.floor((10 * px * have) / need) / 10 + "px";
      }
    }
  }

  // A formula as one line of text, from the MathML that MathJax puts beside it for screen
  // readers: S_i, |S_i|, x^2, a/b.
  function mathText(node) {
    var kids = Array.prototype.slice.call(node.children || []).map(mathText);
    switch (node.localName) {
      case "msub": return kids[0] + "_" + kids[1];
      case "msup": return kids[0] + "^" + kids[1];
      case "msubsup": return kids[0] + "_" + kids[1] + "^" + kids[2];
      case "mfrac": return kids[0] + "/" + kids[1];
      case "mover": return kids[0] + (kids[1] === "^" ? "\u0302" : kids[1] === "\u00AF" ? "\u0304" : "");
      case "mo":
        var t = node.textContent;
        return t === "=" || t === "\u2190" ? " " + t + " " : t === "," ? ", " : t;
      case "mi": case "mn": case "mtext": return node.textContent;
      default: return kids.join("");
    }
  }

  function headerText(th) {
    var out = "";
    (function walk(n) {
      for (var k = n.firstChild; k; k = k.nextSibling) {
        if (k.nodeType === 3) out += k.textContent;
        else if (k.localName === "mjx-container") {
          var m = k.querySelector("mjx-assistive-mml > math");
          out += m ? mathText(m) : "";
        } else if (k.nodeType === 1) walk(k);
      }
    })(th);
    return out.replace(/\s+/g, " ").trim();
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
          var label = headerText(heads[c]);
          if (label) cells[c].setAttribute("data-label", label);
        }
      }
    }
  }

  function start() {
    labelTables();
    fit();
    var timer = null;
    window.addEventListener("resize", function () {
      clearTimeout(timer);
      timer = setTimeout(fit, 60);
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
