"""Strip a chapter notebook down to what is committed: code, markdown and text outputs.

Removed:
  - image outputs (image/png, image/jpeg, image/gif, image/webp, image/svg+xml) and their
    output metadata; an output whose data is left empty is dropped. The text/plain of a
    figure output ("<Figure size 640x480 with 1 Axes>") stays: nbval compares it.
  - the widget-view part of widget outputs (application/vnd.jupyter.widget-view+json holds
    a random model id); their text/plain stays, and nbval compares it. Widgets built with
    normcore.widgets.static_widget print a short deterministic summary there.
  - the notebook's widget state (metadata.widgets): the book build re-executes the notebook
    and embeds fresh state.
  - per-cell execution timestamps (metadata.execution, metadata.ExecuteTime).

Merged: consecutive stream outputs of the same stream (stdout or stderr) become one, as
nbval merges them before comparing; how the kernel split them varies from run to run, and
would otherwise make every re-execution a noisy diff.

Usage:
  python tools/strip_notebook.py chapters/*.ipynb          # rewrite in place
  python tools/strip_notebook.py --check chapters/*.ipynb  # exit 1 if any would change
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

IMAGE_MIMES = ("image/png", "image/jpeg", "image/gif", "image/webp", "image/svg+xml")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
STRIP_MIMES = IMAGE_MIMES + (WIDGET_VIEW, WIDGET_STATE)
CELL_META_DROP = ("execution", "ExecuteTime")


def strip(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for key in CELL_META_DROP:
            cell.metadata.pop(key, None)
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.get("outputs", []):
            if out.get("output_type") in ("display_data", "execute_result"):
                data = out.get("data", {})
                for mime in STRIP_MIMES:
                    data.pop(mime, None)
                    out.get("metadata", {}).pop(mime, None)
                if not data:
                    continue
            if (kept and out.get("output_type") == "stream"
                    and kept[-1].get("output_type") == "stream"
                    and kept[-1].get("name") == out.get("name")):
                kept[-1]["text"] = "".join(kept[-1]["text"]) + "".join(out["text"])
                continue
            kept.append(out)
        cell.outputs = kept
    return nb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--check", action="store_true", help="only report; exit 1 if a notebook is not stripped")
    args = ap.parse_args(argv)
    dirty = []
    for path in args.notebooks:
        before = path.read_text(encoding="utf-8")
        nb = strip(nbformat.reads(before, as_version=4))
        after = nbformat.writes(nb) + "\n"
        if after != before:
            dirty.append(path)
            if not args.check:
                path.write_text(after, encoding="utf-8")
    verb = "not stripped" if args.check else "stripped"
    for path in dirty:
        print(f"{verb}: {path}")
    return 1 if (args.check and dirty) else 0


if __name__ == "__main__":
    sys.exit(main())
