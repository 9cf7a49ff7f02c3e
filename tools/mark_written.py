"""Mark the written parts of the coding exercises that also ask a question in words.

Idempotent: sets ``"written": {"points": P}`` in the ``normcore`` metadata of each listed
exercise's statement cell (cell ids, sources and outputs untouched), then strips the
notebook as it is committed (tools/strip_notebook.py).

    python tools/mark_written.py            # from the repository's root
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
#: chapter -> {label: the points of the answer in words}
WRITTEN = {
    "03_running_stats": {"ex-fold-by-hand": 1, "ex-chan-k": 1},
    "06_group_norm": {"ex-gn-via-ln": 1, "ex-gn-backward": 2},
    "07_weight_standardization": {"ex-ws-backward": 1, "ex-ws-fold": 1},
    "08_papers_in_miniature": {"ex-brn-first-steps": 1},
}


def main() -> int:
    paths = []
    for chapter, labels in WRITTEN.items():
        path = ROOT / "chapters" / f"{chapter}.ipynb"
        nb = nbformat.read(path, as_version=4)
        done = set()
        for cell in nb.cells:
            mark = cell.metadata.get("normcore", {})
            if mark.get("role") == "statement" and mark.get("exercise") in labels:
                mark["written"] = {"points": labels[mark["exercise"]]}
                done.add(mark["exercise"])
        missing = set(labels) - done
        if missing:
            print(f"{path.name}: no statement for {sorted(missing)}", file=sys.stderr)
            return 1
        nbformat.write(nb, path)
        paths.append(str(path))
    subprocess.run([sys.executable, str(ROOT / "tools" / "strip_notebook.py"), *paths],
                   check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
