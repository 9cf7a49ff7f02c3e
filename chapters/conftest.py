"""nbval policy for the chapter notebooks (collected by `pytest --nbval`, see pyproject.toml).

The committed notebooks carry text outputs only: tools/strip_notebook.py removes every image
output. nbval already leaves image/png, image/jpeg and the widget-view JSON (random model ids)
out of its comparison; this extends the same rule to the other image types the strip tool
removes, so a chapter may show an SVG or GIF. Nothing else is exempt: every text output
(text/plain, text/html, streams, errors) is compared strictly.
"""

from __future__ import annotations

import pytest

EXTRA_IMAGE_MIMES = ("image/gif", "image/webp", "image/svg+xml")


@pytest.hookimpl
def pytest_collectstart(collector):
    try:
        from nbval.plugin import IPyNbFile
    except ImportError:  # nbval not installed: nothing to configure
        return
    if isinstance(collector, IPyNbFile):
        collector.skip_compare = tuple(collector.skip_compare) + EXTRA_IMAGE_MIMES
