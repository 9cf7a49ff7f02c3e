"""The browser checks' JavaScript stays in its .js files (no browser, no build needed).

tools/sitecheck/ runs its JavaScript from tools/sitecheck/js/, one function a file, through
_js.load("name") or _js.init_script("name", ...); a file names the files whose functions it
takes on a ` * uses:` line of its header. These tests hold that together: every file is run
by some module (directly, or through another file's `uses:`), every name loaded or used is a
file, every file's header says what its function returns, no Python module of the package
writes JavaScript in a string, and every function, with what it uses, parses (under node,
when it is installed).
"""

from __future__ import annotations

import ast
import io
import json
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tools" / "sitecheck"
sys.path.insert(0, str(ROOT / "tools"))

import sitecheck  # noqa: E402 - importable once sys.path has its folder
from sitecheck import _js  # noqa: E402 - importable once sys.path has its folder

MODULES = sorted(PACKAGE.glob("*.py"))
JS_FILES = sorted(p.stem for p in _js.JS_DIR.glob("*.js"))
#: what JavaScript looks like, and a Python string of the package should not
_JS_IN_STRING = re.compile(r"=>|document\.|window\.|querySelector|getComputedStyle|performance\."
                           r"|localStorage\.|\bfunction\s*\(")


def _loads(path: Path) -> list[tuple[str, int]]:
    """(name, line) of every _js.load("name") and _js.init_script("name", ...) in a module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "_js"
                and node.func.attr in ("load", "init_script") and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.args[0].value, node.lineno))
    return out


LOADS = {(p.name, line): name for p in MODULES for name, line in _loads(p)}


def test_the_package_and_its_files_were_read():
    assert len(MODULES) > 5 and len(JS_FILES) > 10 and len(LOADS) > 10


def test_every_name_loaded_or_used_is_a_file():
    missing = [f"{module}:{line} loads {name!r}" for (module, line), name in LOADS.items()
               if name not in JS_FILES]
    missing += [f"js/{name}.js uses {used!r}" for name in JS_FILES for used in _js.uses(name)
                if used not in JS_FILES]
    assert not missing, "no such file in tools/sitecheck/js/:\n" + "\n".join(missing)


def test_every_js_file_is_run_by_some_module():
    reached, todo = set(), list(LOADS.values())
    while todo:
        name = todo.pop()
        if name not in reached and name in JS_FILES:
            reached.add(name)
            todo += _js.uses(name)
    orphans = sorted(set(JS_FILES) - reached)
    assert not orphans, (f"tools/sitecheck/js/ files no module loads (nor uses through another "
                         f"file): {orphans}")


def test_every_js_file_says_what_it_returns():
    bad = []
    for name in JS_FILES:
        text = _js.source(name)
        header = text.split("*/", 1)[0]
        if not text.startswith("/*") or "*/" not in text or "return" not in header.lower():
            bad.append(name)
    assert not bad, f"js files without a /* header */ that says what they return: {bad}"


def _strings(path: Path):
    """(line, text) of every string literal of a module (f-string pieces included)."""
    kinds = {tokenize.STRING} | {getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if tok.type in kinds:
            yield tok.start[0], tok.string


def test_no_module_writes_javascript_in_a_string():
    found = [f"{p.name}:{line}: {text.strip()[:70]!r}" for p in MODULES
             for line, text in _strings(p) if _JS_IN_STRING.search(text)]
    assert not found, "JavaScript in a Python string (put it in tools/sitecheck/js/):\n" \
        + "\n".join(found)
    assert _JS_IN_STRING.search("() => document.body")


def test_the_widget_types_are_the_ones_the_js_selects():
    assert f'script[type="{sitecheck.WIDGET_VIEW}"]' in _js.source("widget_views")
    assert f'script[type="{sitecheck.WIDGET_STATE}"]' in _js.source("widgets")


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_every_function_parses():
    """Each file as the package runs it (with the functions it uses) is one expression that
    parses; parsing runs nothing."""
    sources = {name: _js.load(name) for name in JS_FILES}
    sources["colour_mode (init script)"] = _js.init_script("colour_mode", "dark")
    check = ("const s = JSON.parse(require('fs').readFileSync(0, 'utf8')); const bad = [];"
             "for (const [n, src] of Object.entries(s)) {"
             "  try { new Function('return (' + src + '\\n);'); } catch (e) { bad.push(n + ': ' + e.message); } }"
             "console.log(JSON.stringify(bad));")
    run = subprocess.run(["node", "-e", check], input=json.dumps(sources), capture_output=True,
                         text=True, timeout=60, check=True)
    bad = json.loads(run.stdout)
    assert not bad, "JavaScript that does not parse:\n" + "\n".join(bad)
