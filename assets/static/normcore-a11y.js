/* normcore book: accessibility of what the page is built from (WCAG 2.1 AA, checked by
 * tests/test_a11y.py with axe-core).
 *
 * 1. The controls of the static-first widgets (normcore.widgets.static_widget), as
 *    @jupyter-widgets/html-manager renders them, have no accessible name: the visible label
 *    (<label class="widget-label">) is not tied to the control, and a slider's handle is an
 *    unnamed role="slider". Toggle buttons are a row of plain buttons. Here every control
 *    of a .normcore-control gets its visible label as its name (aria-labelledby), a
 *    slider's handle says the value the reader sees (aria-valuetext = the readout), and the
 *    toggle buttons become a radio group: one tab stop, the arrow keys (and Home/End) move
 *    the selection, the frame follows. The label's title="null" (ipywidgets' empty tooltip)
 *    is dropped. The frames' text alternatives come from Python (static_widget's alt text).
 * 2. myst-nb's "Show code cell source" <summary> carries aria-label="Toggle hidden
 *    content", which hides its visible text from screen readers (WCAG 2.5.3): dropped, so
 *    the visible text is the name.
 * 3. docutils writes bibliography entries with role="doc-biblioentry", deprecated in
 *    DPUB-ARIA 1.1, inside a role="list": they become role="listitem".
 *
 * Widgets render after window load, so the script watches the page for them.
 */
(function () {
  "use strict";
  var seq = 0;

  function labelId(ctl) {
    var label = ctl.querySelector(":scope > label.widget-label");
    if (!label) return null;
    if (label.getAttribute("title") === "null" || label.getAttribute("title") === "") {
      label.removeAttribute("title");
    }
    if (!label.textContent.trim()) return null;
    if (!label.id) label.id = "normcore-label-" + ++seq;
    return label.id;
  }

  function slider(ctl, id) {
    var handle = ctl.querySelector(".noUi-handle");
    if (!handle) return;
    if (id) handle.setAttribute("aria-labelledby", id);
    var readout = ctl.querySelector(".widget-readout");
    if (!readout) return;
    // the readout is a second, editable way to set the value; keyboard users have the
    // handle, so the readout leaves the tab order and is read as the handle's value
    readout.setAttribute("tabindex", "-1");
    readout.setAttribute("aria-hidden", "true");
    var sync = function () {
      var text = readout.textContent.trim();
      if (text && handle.getAttribute("aria-valuetext") !== text) handle.setAttribute("aria-valuetext", text);
    };
    sync();
    new MutationObserver(sync).observe(readout, { childList: true, characterData: true, subtree: true });
    new MutationObserver(sync).observe(handle, { attributes: true, attributeFilter: ["aria-valuetext", "aria-valuenow"] });
  }

  function toggles(ctl, id) {
    var group = ctl.querySelector(":scope > div");
    if (!group) return;
    var buttons = function () { return Array.prototype.slice.call(group.querySelectorAll("button")); };
    group.setAttribute("role", "radiogroup");
    if (id) group.setAttribute("aria-labelledby", id);
    var sync = function () {
      var all = buttons();
      var active = all.filter(function (b) { return b.classList.contains("mod-active"); })[0] || all[0];
      all.forEach(function (b) {
        b.setAttribute("role", "radio");
        b.setAttribute("aria-checked", b.classList.contains("mod-active") ? "true" : "false");
        b.setAttribute("tabindex", b === active ? "0" : "-1");
      });
    };
    sync();
    new MutationObserver(sync).observe(group, { attributes: true, attributeFilter: ["class"], subtree: true, childList: true });
    group.addEventListener("keydown", function (ev) {
      var all = buttons();
      var i = all.indexOf(document.activeElement);
      if (i < 0) return;
      var j = { ArrowRight: i + 1, ArrowDown: i + 1, ArrowLeft: i - 1, ArrowUp: i - 1, Home: 0, End: all.length - 1 }[ev.key];
      if (j === undefined) return;
      ev.preventDefault();
      j = (j + all.length) % all.length;   // wrap around, as radio groups do
      all[j].focus();
      all[j].click();
    });
  }

  function dropdown(ctl, id) {
    var select = ctl.querySelector("select");
    if (select && id) select.setAttribute("aria-labelledby", id);
  }

  function control(ctl) {
    if (ctl.hasAttribute("data-normcore-a11y")) return;
    // wait until the view has rendered its parts
    if (!ctl.querySelector(".noUi-handle, button, select")) return;
    ctl.setAttribute("data-normcore-a11y", "");
    var id = labelId(ctl);
    if (ctl.classList.contains("widget-toggle-buttons")) toggles(ctl, id);
    else if (ctl.querySelector(".noUi-handle")) slider(ctl, id);
    else dropdown(ctl, id);
  }

  function page(root) {
    root.querySelectorAll(".normcore-control").forEach(control);
    root.querySelectorAll('details.hide > summary[aria-label="Toggle hidden content"]').forEach(function (s) {
      s.removeAttribute("aria-label");
    });
    root.querySelectorAll('[role="doc-biblioentry"]').forEach(function (e) {
      e.setAttribute("role", "listitem");
    });
  }

  function start() {
    page(document);
    var pending = false;
    new MutationObserver(function () {
      if (pending) return;
      pending = true;
      requestAnimationFrame(function () { pending = false; page(document); });
    }).observe(document.body, { childList: true, subtree: true });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
