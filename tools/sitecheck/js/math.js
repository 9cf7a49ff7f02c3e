/* normcore book, site check: the page's math, typeset or not. Returns {total, untypeset,
 * errors, containers}: the number of .math elements, the start of the text of each one left
 * untypeset (no mjx-container inside, or raw TeX delimiters), MathJax's error messages, and
 * the number of mjx-containers on the page.
 */
() => {
    const els = Array.from(document.querySelectorAll('.math'));
    const untypeset = [], errors = [];
    for (const el of els) {
        const raw = Array.from(el.childNodes)
            .filter(n => n.nodeType === Node.TEXT_NODE).map(n => n.textContent).join('');
        if (!el.querySelector('mjx-container') || /\\\(|\\\[|\$\$/.test(raw))
            untypeset.push(el.textContent.slice(0, 80));
    }
    for (const e of document.querySelectorAll('mjx-merror, [data-mjx-error]'))
        errors.push((e.getAttribute('data-mjx-error') || e.textContent).slice(0, 120));
    return {total: els.length, untypeset, errors,
            containers: document.querySelectorAll('mjx-container').length};
}
