r"""Pictures for the InstanceNorm chapter, on two real photographs.

* :func:`photos`: scikit-learn's two sample photographs (``china.jpg``, ``flower.jpg``, shipped
  inside its wheel, no download), downscaled, as a float64 tensor ``(2, 3, H, W)`` in
  :math:`[0, 1]`.
* :func:`adjust`: change an image's contrast and brightness, an affine map per channel.
* :func:`normalized`: the temple photo, adjusted, after no norm, BatchNorm (in a batch with the
  unadjusted flower photo), InstanceNorm or LayerNorm; :func:`contrast_figure` draws it with
  the histograms of its three channels (the frames of the chapter's first widget).
* :func:`adain_figure`: content, style, and AdaIN's output with the content-style trade-off
  ``alpha`` (the frames of the second widget).

Every number comes from :mod:`normcore.functional`; nothing here recomputes a norm.  Figures
are plain :class:`matplotlib.figure.Figure` objects, :data:`FRAME_WIDTH` CSS pixels wide at
80 px per inch (:func:`normcore.widgets.static_widget` renders them at twice that for HiDPI
screens); their text, at least 10.5 pt, is at least 10 px tall even where a phone's column
shrinks a frame to 332 px.
"""
from __future__ import annotations

import functools
import numbers

import numpy as np
import torch
from matplotlib.figure import Figure

from .. import functional as F
from . import phone

__all__ = ["PHOTO_NAMES", "PHOTO_LABELS", "NORMS", "NORM_TITLES", "FRAME_WIDTH", "photos", "adjust",
           "normalized", "to_display", "contrast_figure", "adain_figure",
           "feature_stats_figure"]

#: The two photographs, in the order of :func:`photos` (scikit-learn's file names).
PHOTO_NAMES = ("china", "flower")
#: What they show: the names the chapter uses.
PHOTO_LABELS = {"china": "temple", "flower": "flower"}
#: The norms of the contrast widget.
NORMS = ("none", "batch", "instance", "layer")
NORM_TITLES = {"none": "no norm (the input)", "batch": "BatchNorm, batch of both photos",
               "instance": "InstanceNorm", "layer": "LayerNorm"}
#: Display width of a widget frame in CSS pixels (the PNG has twice as many).
FRAME_WIDTH = 360
_DPI = 80                  # CSS px per inch of the figures
_CHANNEL_COLORS = ("#d62728", "#2ca02c", "#1f77b4")
_FONT = 11.5               # pt; the smallest text (_FONT - 1) is 11.7 px at 80 px per inch,
                           # 10.1 px in a phone column in dark mode (312 of 360 px)


@functools.lru_cache(maxsize=4)
def _photos(height: int) -> torch.Tensor:
    from PIL import Image
    from sklearn.datasets import load_sample_image

    out = []
    for name in PHOTO_NAMES:
        arr = load_sample_image(f"{name}.jpg")                  # (427, 640, 3) uint8
        img = Image.fromarray(arr)
        width = round(height * img.width / img.height)
        img = img.resize((width, height), Image.Resampling.LANCZOS)
        t = torch.tensor(np.asarray(img), dtype=torch.float64)      # (H, W, 3)
        out.append(t.permute(2, 0, 1) / 255.0)
    return torch.stack(out)


def photos(height: int = 72) -> torch.Tensor:
    """The two photographs as ``(2, 3, height, width)`` float64 in [0, 1] (a fresh copy)."""
    if isinstance(height, bool) or not isinstance(height, numbers.Integral) or not 2 <= height <= 427:
        raise ValueError(f"photos: height must be an int in [2, 427], got {height!r}")
    return _photos(int(height)).clone()


def adjust(x: torch.Tensor, contrast: float = 1.0, brightness: float = 0.0) -> torch.Tensor:
    """``0.5 + contrast * (x - 0.5) + brightness``: contrast about mid-grey, then a shift.

    The same affine map :math:`x \\mapsto a x + b` for every pixel and channel, with
    :math:`a` = ``contrast`` and :math:`b = 0.5 (1 - a)` + ``brightness``.
    """
    if not contrast > 0:
        raise ValueError(f"adjust: contrast must be > 0, got {contrast!r}")
    return contrast * x + (0.5 * (1 - contrast) + brightness)      # a x + b


def normalized(norm: str, contrast: float = 1.0, brightness: float = 0.0,
               height: int = 72) -> torch.Tensor:
    """The temple photo (``china.jpg``), adjusted, after ``norm``: ``(3, H, W)``.

    ``"batch"`` normalizes it in one batch with the *unadjusted* flower photo (training mode,
    batch statistics), ``"instance"`` and ``"layer"`` on its own (LayerNorm over
    ``(C, H, W)``); no affine parameters.
    """
    imgs = photos(height)
    x = adjust(imgs[0:1], contrast, brightness)
    if norm == "none":
        return x[0]
    if norm == "batch":
        return F.batch_norm(torch.cat([x, imgs[1:2]]), None, None, training=True)[0]
    if norm == "instance":
        return F.instance_norm(x)[0]
    if norm == "layer":
        return F.layer_norm(x, x.shape[1:])[0]
    raise ValueError(f"normalized: norm must be one of {NORMS}, got {norm!r}")


def to_display(y: torch.Tensor, norm: str) -> torch.Tensor:
    """``(3, H, W)`` -> ``(H, W, 3)`` in [0, 1] for imshow: the input as it is (clipped), a
    normalized output by the fixed map ``0.5 + y / 6`` (so -3 is black and +3 white)."""
    d = y if norm == "none" else 0.5 + y / 6.0
    return d.clamp(0, 1).permute(1, 2, 0)


def _hist(ax, y: torch.Tensor, norm: str) -> None:
    lo, hi = (-0.5, 1.5) if norm == "none" else (-3.5, 3.5)
    bins = torch.linspace(lo, hi, 57, dtype=y.dtype)
    centers = ((bins[1:] + bins[:-1]) / 2).numpy()
    for c, (name, col) in enumerate(zip("RGB", _CHANNEL_COLORS)):
        h = torch.histogram(y[c].flatten().clamp(lo, hi), bins=bins, density=True).hist
        ax.plot(centers, h.numpy(), color=col, lw=1.4, label=name)
    ax.set_xlim(lo, hi)
    ax.set_xticks([-0.5, 0.0, 0.5, 1.0, 1.5] if norm == "none" else [-3, -2, -1, 0, 1, 2, 3])
    ax.set_ylim(0, 4.0 if norm == "none" else 1.3)
    ax.set_yticks([])
    ax.tick_params(labelsize=_FONT, length=2)
    ax.set_xlabel("pixel value" if norm == "none" else "normalized value", fontsize=_FONT)
    ax.legend(fontsize=_FONT, frameon=False, loc="upper right", handlelength=1.0)


def _stats_line(y: torch.Tensor) -> str:
    m = y.mean((1, 2))
    s = y.std((1, 2), unbiased=False)
    def fmt(v, sign):
        v = round(float(v), 2) + 0.0                  # no "-0.00"
        return f"{v:+.2f}" if sign else f"{v:.2f}"
    return "mean " + " ".join(fmt(v, True) for v in m) + "   std " + \
        " ".join(fmt(v, False) for v in s)


def contrast_figure(contrast: float, brightness: float, norm: str, height: int = 72) -> Figure:
    """One frame of the contrast widget: the (adjusted, normalized) china photo, its channel
    means and standard deviations (R G B), and the histograms of its three channels."""
    y = normalized(norm, contrast, brightness, height)
    fig = Figure(figsize=(FRAME_WIDTH / _DPI, 4.3))
    fig.subplots_adjust(left=0.05, right=0.95, top=0.93, bottom=0.11, hspace=0.4)
    ax_img, ax_h = fig.subplots(2, 1, gridspec_kw={"height_ratios": [1.55, 1]})
    ax_img.imshow(to_display(y, norm).numpy(), interpolation="nearest")
    ax_img.set_axis_off()
    ax_img.set_title(NORM_TITLES[norm], fontsize=_FONT + 1)
    ax_img.text(0.5, -0.04, _stats_line(y), transform=ax_img.transAxes, ha="center", va="top",
                fontsize=_FONT, family="monospace")
    _hist(ax_h, y, norm)
    return fig


def adain_figure(content: str, style: str, alpha: float, height: int = 72) -> Figure:
    """One frame of the AdaIN widget: content and style photos, and
    ``adaptive_instance_norm(content, style, alpha)`` in pixel space (colour transfer)."""
    imgs = photos(height)
    x = imgs[PHOTO_NAMES.index(content)][None]
    s = imgs[PHOTO_NAMES.index(style)][None]
    out = F.adaptive_instance_norm(x, s, alpha)[0]
    fig = Figure(figsize=(FRAME_WIDTH / _DPI, 3.9))
    fig.subplots_adjust(left=0.02, right=0.98, top=0.93, bottom=0.02, hspace=0.3, wspace=0.06)
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 1.9])
    for k, (img, title) in enumerate(((x[0], f"content: {PHOTO_LABELS[content]}"),
                                      (s[0], f"style: {PHOTO_LABELS[style]}"))):
        ax = fig.add_subplot(grid[0, k])
        ax.imshow(to_display(img, "none").numpy(), interpolation="nearest")
        ax.set_title(title, fontsize=_FONT)
        ax.set_axis_off()
    ax = fig.add_subplot(grid[1, :])
    ax.imshow(to_display(out, "none").numpy(), interpolation="nearest")
    ax.set_title(f"AdaIN output, alpha = {alpha:g}", fontsize=_FONT + 1)
    ax.set_axis_off()
    return fig


def feature_stats_figure(mu_c, s_c, mu_s, s_s, mu_o, s_o, *, narrow: bool = False) -> Figure:
    """Per-channel (mean, std) of content, style and AdaIN output features: the output's
    points land on the style's.

    ``narrow``: the phone layout (:mod:`normcore.viz.phone`), the std panel under the mean
    panel."""
    if narrow:
        fig = phone.figure(4.6)
        axs = fig.subplots(2, 1, sharex=True)
        font = 10.0
    else:
        fig = Figure(figsize=(5.6, 2.9))
        fig.subplots_adjust(left=0.12, right=0.98, top=0.9, bottom=0.3, wspace=0.3)
        axs = fig.subplots(1, 2)
        font = _FONT
    k = torch.arange(len(mu_c)).numpy()
    for ax, (c, s, o), name in ((axs[0], (mu_c, mu_s, mu_o), "channel mean"),
                                (axs[1], (s_c, s_s, s_o), "channel std")):
        ax.plot(k, c.numpy(), "o", ms=5, color="#9a9a9a", label="content")
        ax.plot(k, s.numpy(), "s", ms=8, mfc="none", color="#1f77b4", label="style")
        ax.plot(k, o.numpy(), "x", ms=6, color="#d62728", label="AdaIN output")
        ax.set_title(name, fontsize=font)
        if not narrow or ax is axs[1]:
            ax.set_xlabel("feature channel c", fontsize=font)
        ax.tick_params(labelsize=font - 1)
        ax.grid(True, lw=0.4, alpha=0.5)
    # below the panels, where it can hide no point
    if narrow:
        axs[0].tick_params(labelbottom=True)
        phone.legend_below(fig, axs[0], ncol=3, fontsize=font - 1)
        return fig
    handles, labels = axs[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=_FONT - 1,
               frameon=False)
    return fig
