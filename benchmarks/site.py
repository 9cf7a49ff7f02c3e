"""Measure the built book: page weights against the 3 MB budget, the shared _static/ weight,
where the widget manager (embed.js) is loaded, and load times in headless Chromium.

    .venv/bin/python benchmarks/site.py                 # measure _build/html as it is
    .venv/bin/python benchmarks/site.py --clean-build   # first time a clean build:
                                                        #   rm -rf _build && jupyter-book build ...
    .venv/bin/python benchmarks/site.py --runs 5        # load each page 5 times (median)

A page's own weight is its HTML, its widget state (a file of its own), the widgets' frames (in
_frames/, each fetched when shown) and the images it references outside _static/. _static/ is
shared by all pages and cached by the browser after the first; "loaded" is what the browser
actually fetched for the page (decoded bytes, everything included, cold cache). Load time is
navigation start to the end of the load event, cold cache, from a server on 127.0.0.1; "ready"
(time to interactive) is navigation start to the moment the page's math is typeset and every
widget of the first screen is rendered (and so responds). The widget manager is loaded when a
widget comes near the viewport (assets/static/normcore-widgets.js), so a page is measured
twice: "first" is what the first screen loads (once the network is quiet), "scrolled" what a
reader who scrolls through the whole page has loaded; "widget in view" times, on a fresh page
whose load has settled, the first widget scrolled into view until it is rendered and until
moving its first control has changed its frame. Prints; asserts nothing (the budget is
asserted by tests/test_site.py). The closing note sets "loaded" and "ready" beside the same
figures measured before the page-weight work (benchmarks/site_before.json, written by
`--save`) and the goals.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import sitecheck  # noqa: E402 - importable once sys.path has its folder

MB = 1024 * 1024
#: the site as it was measured before the page-weight work (issue 8): `--save` wrote it
BEFORE = ROOT / "benchmarks" / "site_before.json"
#: what a page may load (decoded bytes, cold cache), as tests/test_site.py asserts it
GOALS = {"intro": 1.5 * MB, "chapter": 4 * MB}


def clean_build() -> float:
    jb = Path(sys.executable).with_name("jupyter-book")
    shutil.rmtree(ROOT / "_build", ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run(
        [str(jb), "build", "--all", "-W", "-n", "--keep-going", "."],
        cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


def measure_loads(html: Path, pages: list[str], runs: int) -> dict[str, dict]:
    from playwright.sync_api import sync_playwright

    out: dict[str, dict] = {}
    with sitecheck.LocalServer(html) as server, sync_playwright() as p:
        browser = sitecheck.launch(p)
        try:
            for rel in pages:
                times, ready, loaded, nreq = [], [], 0, 0
                first, scrolled, w_render, w_respond = [], [], [], []
                for _ in range(runs):
                    context, page = sitecheck.open_cold(browser, server, rel)
                    ready.append(sitecheck.ready_ms(page))
                    times.append(sitecheck.load_ms(page))
                    files = sitecheck.loaded_files(page)
                    loaded, nreq = sum(f["bytes"] for f in files), len(files)
                    # what the first screen loads, and what a reader who scrolls through loads
                    sitecheck.settle(page)
                    first.append(sitecheck.loaded_bytes(page))
                    sitecheck.scroll_through(page)
                    scrolled.append(sitecheck.loaded_bytes(page))
                    context.close()
                    # the first widget scrolled into view of a loaded page: until it renders, responds
                    context, page = sitecheck.open_cold(browser, server, rel)
                    sitecheck.settle(page)
                    r = sitecheck.first_widget_response(page)
                    context.close()
                    if r:
                        w_render.append(r["render_ms"])
                        w_respond.append(r["respond_ms"])
                med = lambda xs: statistics.median(xs) if xs else float("nan")
                out[rel] = {"load_ms": statistics.median(times), "ready_ms": statistics.median(ready),
                            "loaded": loaded, "requests": nreq,
                            "first": med(first), "scrolled": med(scrolled),
                            "widget_render_ms": med(w_render), "widget_respond_ms": med(w_respond)}
        finally:
            browser.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--html", type=Path, default=ROOT / "_build" / "html")
    ap.add_argument("--clean-build", action="store_true",
                    help="time `rm -rf _build && jupyter-book build --all -W -n --keep-going .` first")
    ap.add_argument("--runs", type=int, default=3, help="page loads per page (median reported)")
    ap.add_argument("--toc", type=Path, default=None, help="the _toc.yml of --html's book (default: the book's own)")
    ap.add_argument("--save", type=Path, default=None, help="write the measurements as JSON (e.g. a baseline)")
    ap.add_argument("--before", type=Path, default=BEFORE,
                    help=f"measurements to compare with in the closing note (default: {BEFORE.relative_to(ROOT)})")
    args = ap.parse_args()

    if args.clean_build:
        secs = clean_build()
        print(f"clean build (rm -rf _build && jupyter-book build --all -W -n --keep-going .): {secs:.1f} s\n")

    html = args.html
    if not (html / "index.html").is_file():
        sys.exit(f"{html} has no built book: run `make book` first")
    pages = sitecheck.toc_pages(args.toc or ROOT / "_toc.yml")
    weights = [sitecheck.page_weight(html, rel) for rel in pages]
    loads = measure_loads(html, pages, args.runs) if Path(sitecheck.CHROMIUM).exists() else {}

    static = html / "_static"
    embed = static / "html-manager" / "embed.js"
    mathjax = static / "mathjax"
    print(f"{'page':40s} {'own MB':>7s} {'budget':>7s} {'html':>9s} {'w-state':>9s} {'frames':>9s} {'images':>9s} "
          f"{'math':>8s} {'embed.js':>8s} {'loaded MB':>9s} {'reqs':>5s} {'load ms':>8s} {'ready ms':>8s}")
    for w in weights:
        ld = loads.get(w.rel, {})
        print(
            f"{w.rel:40s} {w.own / MB:7.3f} {w.own / sitecheck.PAGE_BUDGET:6.1%} {w.html:9d} "
            f"{w.widget_state:9d} {w.frames:9d} {w.images:9d} {w.math:8d} "
            f"{'yes' if w.embed_js else 'no':>8s} "
            f"{ld.get('loaded', float('nan')) / MB:9.2f} {ld.get('requests', 0):5d} "
            f"{ld.get('load_ms', float('nan')):8.0f} {ld.get('ready_ms', float('nan')):8.0f}"
        )
    if loads:
        # a page as a reader meets it: the first screen, then scrolled to the end
        print(f"\n{'page':40s} {'first MB':>8s} {'scrolled MB':>11s} {'ready ms':>8s} "
              f"{'widget in view -> rendered ms':>29s} {'-> responds ms':>14s}")
        for w in weights:
            ld = loads.get(w.rel, {})
            print(f"{w.rel:40s} {ld.get('first', float('nan')) / MB:8.2f} "
                  f"{ld.get('scrolled', float('nan')) / MB:11.2f} "
                  f"{ld.get('ready_ms', float('nan')):8.0f} "
                  f"{ld.get('widget_render_ms', float('nan')):29.0f} "
                  f"{ld.get('widget_respond_ms', float('nan')):14.0f}")
    print()
    print("(math: bytes of the page's HTML that are typeset math, CHTML markup and its stylesheet)")
    fonts = ("the fonts only: the math is typeset at build time"
             if not (mathjax / "tex-chtml.js").is_file() else "loaded lazily in part")
    print(f"shared _static/: {sitecheck.dir_size(static) / MB:.2f} MB on disk "
          f"(mathjax/ {sitecheck.dir_size(mathjax) / MB:.2f} MB, {fonts}; "
          f"html-manager/ {sitecheck.dir_size(static / 'html-manager') / MB:.2f} MB)")
    if embed.is_file():
        on = [w.rel for w in weights if w.embed_js]
        print(f"embed.js: {embed.stat().st_size / MB:.2f} MB, loaded on {len(on)} of {len(weights)} pages: "
              f"{', '.join(on) if on else '(none: no page has widgets yet)'}")
    heaviest = max(weights, key=lambda w: w.own)
    print(f"heaviest page: {heaviest.rel}, {heaviest.own / MB:.3f} MB = "
          f"{heaviest.own / sitecheck.PAGE_BUDGET:.1%} of the 3 MB budget")
    if not loads:
        print(f"(load times not measured: {sitecheck.CHROMIUM} is missing)")
        return
    now = {rel: {"loaded": ld["loaded"], "ready_ms": ld["ready_ms"], "load_ms": ld["load_ms"],
                 "first": ld["first"], "scrolled": ld["scrolled"], "widget_respond_ms": ld["widget_respond_ms"]}
           for rel, ld in loads.items()}
    if args.save:
        args.save.write_text(json.dumps(now, indent=1) + "\n", encoding="utf-8")
        print(f"measurements written to {args.save}")
    closing_note(now, args.before, widget_pages={w.rel for w in weights if w.embed_js})


def closing_note(now: dict, before_file: Path, widget_pages: set[str]) -> None:
    """Before and after, per page: loaded MB (cold cache; now at first and scrolled through),
    ready ms and how soon the first widget responds, against the goals."""
    before = json.loads(before_file.read_text(encoding="utf-8")) if before_file.is_file() else {}
    print()
    print(f"closing note: loaded MB and ready ms, before ({before_file.name}) and now; "
          f"goals: the intro (and every page without widgets) under {GOALS['intro'] / MB:.1f} MB, "
          f"a chapter under {GOALS['chapter'] / MB:.0f} MB, "
          "widgets interactive under 2000 ms")
    print(f"{'page':40s} {'before MB':>9s} {'first MB':>8s} {'scrolled MB':>11s} {'goal MB':>7s} "
          f"{'before ms':>9s} {'ready ms':>8s} {'widget responds ms':>18s}")
    for rel, n in now.items():
        b = before.get(rel, {})
        goal = GOALS["chapter"] if rel in widget_pages else GOALS["intro"]  # as tests/test_site.py
        worst = max(n["first"], n["scrolled"])
        flag = "" if worst <= goal and not n.get("widget_respond_ms", 0) > 2000 else "  OVER"
        print(f"{rel:40s} {b.get('loaded', float('nan')) / MB:9.2f} {n['first'] / MB:8.2f} {n['scrolled'] / MB:11.2f} "
              f"{goal / MB:7.1f} {b.get('ready_ms', float('nan')):9.0f} {n['ready_ms']:8.0f} "
              f"{n.get('widget_respond_ms', float('nan')):18.0f}{flag}")


if __name__ == "__main__":
    main()
