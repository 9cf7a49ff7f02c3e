"""The site check's JavaScript: the files of js/, each one function expression, read once.

A file's header comment says what its function returns. page.evaluate(), locator.evaluate()
and page.wait_for_function() take the text that load() returns and call the function it
evaluates to, with the argument given (Playwright does that for any expression whose value
is a function).

A file may call the functions of other files: its header names them on a line
` * uses: widget_views is_rendered`, and the file is then a function of those functions that
returns the function to run (its parameters, in that order, are theirs). load() applies it
to them, `(file)(widget_views, is_rendered)`, each loaded the same way. So a piece that
several checks share (which scripts are widget views, whether one is rendered) is written
once, as a function of its own.

An init script (context.add_init_script) is run, not called: init_script() applies its
function to arguments given as JSON, as Playwright's JavaScript API does for a function
init script.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

JS_DIR = Path(__file__).resolve().with_name("js")
_USES = re.compile(r"^ \* uses:(.*)$", re.M)


@functools.cache
def source(name: str) -> str:
    """The text of js/<name>.js."""
    path = JS_DIR / f"{name}.js"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    return path.read_text(encoding="utf-8")


def uses(name: str) -> list[str]:
    """The files whose functions js/<name>.js takes, from its header's `uses:` line."""
    header = source(name).split("*/", 1)[0]
    found = _USES.search(header)
    return found.group(1).split() if found else []


def _apply(function: str, args: list[str]) -> str:
    # a newline before the closing parenthesis: a file may end in a // comment
    return f"({function}\n)({', '.join(args)})"


@functools.cache
def load(name: str) -> str:
    """The function of js/<name>.js, applied to the functions it uses, if any."""
    needs = uses(name)
    return _apply(source(name), [load(n) for n in needs]) if needs else source(name)


def init_script(name: str, *args) -> str:
    """js/<name>.js as an init script: its function called with `args` (as JSON)."""
    return _apply(load(name), [json.dumps(a) for a in args])
