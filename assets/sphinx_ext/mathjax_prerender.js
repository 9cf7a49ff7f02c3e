// Typeset the TeX of one page at build time with MathJax 3 (the npm package pinned in
// package.json), so that the built page loads no MathJax script. Driven by normcore_math.py
// (the Sphinx extension next to this file), which finds the page's math and puts the
// output back.
//
//   node mathjax_prerender.js < request.json > response.json
//
// request:  {"mathjax": "<node_modules/mathjax>", "fontURL": "<woff-v2 folder, from the page>",
//            "config": {"tex": {...}, "chtml": {...}}, "fragments": ["<html>", ...]}
//           Each fragment is the inner HTML of one element whose math MathJax would typeset
//           in the browser (Sphinx's .math elements, a widget's HTMLMath value): its
//           \(...\), \[...\], $$...$$ and \begin{...}...\end{...}.
// response: {"fragments": ["<the same fragment, its math typeset>", ...],
//            "css": "<the CHTML stylesheet: the characters used, @font-face rules>",
//            "errors": [{"fragment": i, "tex": "...", "message": "..."}, ...],
//            "formulas": <count>, "assistive": <how many of them carry assistive MathML>,
//            "version": "<MathJax version>"}
//
// The output is what MathJax made in the browser: CommonHTML (CHTML) with the assistive
// MathML that screen readers read (a11y/assistive-mml); only the menu is gone. A TeX error
// (an undefined macro, unbalanced braces) is reported in "errors", never hidden.

"use strict";

const path = require("path");

function readStdin() {
  return new Promise((resolve, reject) => {
    const chunks = [];
    process.stdin.on("data", (c) => chunks.push(c));
    process.stdin.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    process.stdin.on("error", reject);
  });
}

async function main() {
  const request = JSON.parse(await readStdin());
  const es5 = path.join(request.mathjax, "es5");
  const user = request.config || {};
  const MathJax = await require(path.join(es5, "node-main.js")).init({
    loader: {
      paths: { mathjax: es5 },
      // node-main.js brings the liteDOM adaptor (MathJax's own DOM for node)
      load: ["input/tex", "output/chtml", "a11y/assistive-mml"],
      require: require,
    },
    tex: Object.assign({}, user.tex || {}),
    chtml: Object.assign({}, user.chtml || {}, { fontURL: request.fontURL }),
    startup: { typeset: false },
  });
  const adaptor = MathJax.startup.adaptor;

  // one document holds the page's fragments, each in a marked div
  const html = "<!DOCTYPE html><html><head></head><body>" +
    request.fragments.map((f, i) => `<div data-nc-fragment="${i}">${f}</div>`).join("") +
    "</body></html>";
  const doc = MathJax.startup.getDocument(html);
  doc.render(); // find, compile, typeset, add the assistive MathML, update the document

  const body = adaptor.body(doc.document);
  const holders = adaptor.childNodes(body).filter((n) => adaptor.kind(n) === "div");
  if (holders.length !== request.fragments.length) {
    throw new Error(`${request.fragments.length} fragments in, ${holders.length} out`);
  }
  const fragmentOf = (node) => {
    for (let el = node; el; el = adaptor.parent(el)) {
      if (adaptor.kind(el) === "div" && adaptor.parent(el) === body) {
        return Number(adaptor.getAttribute(el, "data-nc-fragment"));
      }
    }
    return -1;
  };

  const errors = [];
  let formulas = 0;
  for (const item of doc.math) {
    formulas++;
    let message = null;
    item.root.walkTree((node) => {
      if (message === null && node.isKind("merror")) {
        message = node.attributes.get("data-mjx-error") || "TeX error";
      }
    });
    if (message !== null) {
      errors.push({ fragment: fragmentOf(item.start.node), tex: item.math, message: String(message) });
    }
  }
  // every formula's output should carry its MathML for screen readers
  const assistive = Array.from(doc.math).filter((item) =>
    adaptor.childNodes(item.typesetRoot).some((n) => adaptor.kind(n) === "mjx-assistive-mml")).length;
  process.stdout.write(JSON.stringify({
    fragments: holders.map((d) => adaptor.innerHTML(d)),
    css: adaptor.textContent(MathJax.startup.output.styleSheet(doc)),
    errors,
    formulas,
    assistive,
    version: MathJax.version,
  }));
}

main().catch((err) => {
  process.stderr.write("mathjax_prerender: " + (err && err.stack ? err.stack : String(err)) + "\n");
  process.exit(1);
});
