"""Moving every control of every widget through all its values, as a reader would, and
checking that each move changes the visible frame.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import _js

if TYPE_CHECKING:
    from .browser import PageReport


def signature(root) -> str:
    """What a widget (the locator `root`) shows: the HTML of its visible frames and a hash of
    each visible image's bytes, one line each."""
    return root.evaluate(_js.load("signature"))


def controls(root) -> list[dict]:
    """The widget's controls (selects, toggle buttons, slider handles), each marked with
    data-nc-ctl="<its index>": [{"kind", "n" (values), "index" (the current one)}, ...]."""
    return root.evaluate(_js.load("controls"))


def _frames_shot(root) -> bytes | None:
    frames = root.locator(".normcore-frames").first
    if frames.count() == 0:
        return None
    return frames.screenshot()


def _wait_change(page, root, before: str, timeout_s: float = 5.0) -> str:
    t0 = time.monotonic()
    sig = before
    while time.monotonic() - t0 < timeout_s:
        sig = signature(root)
        if sig != before:
            page.wait_for_timeout(100)  # let the new frame finish rendering
            return signature(root)
        page.wait_for_timeout(50)
    return sig


def move_control(ctl, kind: str, target: int, current: int) -> None:
    """Move a widget control (a locator of its data-nc-ctl element) from value index
    `current` to `target` as a reader would: pick the option, click the button, or press an
    arrow key (a slider moves one step)."""
    if kind == "select":
        ctl.select_option(index=target)
    elif kind == "toggle":
        ctl.locator("button").nth(target).click()
    else:
        ctl.focus()
        ctl.press("ArrowRight" if target > current else "ArrowLeft")


def exercise_widgets(page, report: PageReport, shots_dir: Path | None = None) -> None:
    """Move every control of every rendered widget through all its values; after each move
    the visible frame (HTML content and image pixels, and a screenshot of the frame area
    for static_widget widgets) must differ from before. Appends to report.moves/problems."""
    roots = page.locator(".widget-subarea > .jupyter-widgets")
    for w in range(roots.count()):
        root = roots.nth(w)
        root.scroll_into_view_if_needed()
        found = controls(root)
        for c, info in enumerate(found):
            ctl = root.locator(f'[data-nc-ctl="{c}"]')
            order = [i for i in range(info["n"]) if i != info["index"]]
            if info["kind"] == "slider":
                # the keyboard moves a slider one step: sweep up to the end, then down to 0
                i, n = info["index"], info["n"]
                up = list(range(i + 1, n))
                order = up + list(range((n - 2) if up else (i - 1), -1, -1))
            current = info["index"]
            for target in order:
                before = signature(root)
                shot_before = _frames_shot(root)
                move_control(ctl, info["kind"], target, current)
                after = _wait_change(page, root, before)
                shot_after = _frames_shot(root)
                move = {
                    "widget": w, "control": c, "kind": info["kind"], "from": current, "to": target,
                    "frame_changed": after != before,
                    "pixels_changed": None if shot_before is None else shot_before != shot_after,
                }
                report.moves.append(move)
                if not move["frame_changed"] or move["pixels_changed"] is False:
                    report.problems.append(
                        f"{report.rel}: widget {w}, control {c} ({info['kind']}) {current}->{target}: "
                        "the visible frame did not change"
                    )
                if shots_dir is not None and shot_after is not None:
                    shots_dir.mkdir(parents=True, exist_ok=True)
                    name = f"{Path(report.rel).with_suffix('').as_posix().replace('/', '__')}__w{w}c{c}v{target}.png"
                    (shots_dir / name).write_bytes(shot_after)
                current = target

