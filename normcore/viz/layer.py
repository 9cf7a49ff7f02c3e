r"""Pictures for the LayerNorm and RMSNorm chapter.

* :func:`set_svg`: a ``(N, C, H, W)`` block drawn as ``N`` rows of ``C`` small ``H x W``
  grids, with the set :math:`S_i` of one element highlighted for LayerNorm over a chosen
  ``normalized_shape`` (the trailing 1, 2 or 3 dims) and, beside it, for BatchNorm.  Which
  cells are in :math:`S_i` is read from :func:`normcore.axes.stat_groups`; the mean and
  variance printed are those of the highlighted cells of a seeded sample.
* :func:`numerics` and :func:`numerics_svg`: the variance of a set whose values sit at a
  large offset, computed three ways (:func:`normcore.stats.var_naive`,
  :func:`~normcore.stats.var_two_pass`, :func:`~normcore.stats.var_welford`) in a chosen
  dtype, against a float64 reference; one frame of the chapter's numerics explorer.
* :func:`variance_error_figure`: the relative error of the three variances as the offset
  grows.
* :func:`grad_norms_figure`: gradient norm per layer of small transformer stacks.

The SVGs are hand-written (no ``id`` attributes; one scoped ``<style>``; a ``<title>`` in
words) on a white card, so they read the same in light and dark mode.  Figures are plain
:class:`matplotlib.figure.Figure` objects (not registered with pyplot).
"""
from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch
from matplotlib.figure import Figure

from .. import axes, stats
from . import phone

__all__ = ["set_svg", "set_statistics", "numerics", "numerics_svg", "METHODS",
           "variance_error_figure", "grad_norms_figure", "COLORS"]

#: One colour per variance method (and per transformer variant), shared with the prose.
COLORS = {
    "naive": "#d62728", "two-pass": "#1f77b4", "welford": "#2ca02c",
    "Post-LN": "#d62728", "Pre-LN": "#1f77b4", "DeepNorm": "#2ca02c",
    "DeepNorm (alpha on F)": "#9467bd",
}

#: Legend labels in the book's notation (DeepNorm's constant is alpha_DN, the sublayer F).
LABELS = {"DeepNorm (alpha on F)": r"DeepNorm, $\alpha_{\mathrm{DN}}$ on $\mathcal{F}$"}

_CSS = (
    ".nc-ln{font:13px sans-serif;fill:#222}"
    ".nc-ln rect{fill:#f1f3f5;stroke:#a3abb3;stroke-width:.7}"
    ".nc-ln rect.s{fill:#86b4ea;stroke:#123f80;stroke-width:1.1}"
    ".nc-ln rect.i{fill:#0d3b82;stroke:#000;stroke-width:1.8}"
    ".nc-ln .h{font-weight:bold}.nc-ln .q{fill:#444}.nc-ln .m{text-anchor:middle}"
    ".nc-ln .e{text-anchor:end}.nc-ln circle{fill:#1f77b4;fill-opacity:.75;stroke:none}"
    ".nc-ln line{stroke:#888;stroke-width:1}.nc-ln .bad{fill:#b00020;font-weight:bold}"
)

_DIM_NAMES = ("N", "C", "H", "W")


def _esc(text: str) -> str:
    return html.escape(str(text), quote=True)


def _svg(width: int, height: int, title: str, body: list[str], attrs: Mapping[str, str]) -> str:
    data = "".join(f' data-{k}="{_esc(v)}"' for k, v in attrs.items())
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="nc-ln" role="img" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'style="max-width:100%;height:auto;background:#fff"{data}>'
            f"<title>{_esc(title)}</title><style>{_CSS}</style>" + "".join(body) + "</svg>")


def _num(v: float) -> str:
    return f"{v:.2f}".replace("-0.00", "0.00")


# ------------------------------------------------------------------------------------------
# the normalized-set explorer
# ------------------------------------------------------------------------------------------
class SetStatistics(NamedTuple):
    """The set of one element under one norm: its mask, size, mean and biased variance."""

    mask: torch.Tensor
    size: int
    mean: float
    var: float


def sample(shape=(2, 3, 2, 4), seed: int = 0) -> torch.Tensor:
    """The seeded input the explorer shows: channel ``c`` has mean ``2c`` and spread
    ``1 + c`` (so BatchNorm's and LayerNorm's statistics differ visibly)."""
    g = torch.Generator().manual_seed(seed)
    C = shape[1]
    loc = (2.0 * torch.arange(C, dtype=torch.float64)).reshape(1, C, *([1] * (len(shape) - 2)))
    scale = (1.0 + torch.arange(C, dtype=torch.float64)).reshape_as(loc)
    return torch.randn(shape, generator=g, dtype=torch.float64) * scale + loc


def set_statistics(x: torch.Tensor, norm: str, element, normalized_ndim: int | None = None
                   ) -> SetStatistics:
    """The set :math:`S_i` of ``element`` (read from :func:`normcore.axes.stat_groups`) and
    the mean and biased variance of ``x`` over it."""
    labels = axes.stat_groups(norm, x.shape, normalized_ndim=normalized_ndim)
    mask = labels == labels[tuple(element)]
    vals = x[mask].double()
    return SetStatistics(mask, int(mask.sum()), float(vals.mean()),
                         float(((vals - vals.mean()) ** 2).mean()))


def _grid(mask: torch.Tensor, element, ox: int, oy: int, cell: int, gap: int) -> list[str]:
    N, C, H, W = mask.shape
    out = []
    for n in range(N):
        for c in range(C):
            for h in range(H):
                for w in range(W):
                    x = ox + c * (W * cell + gap) + w * cell
                    y = oy + n * (H * cell + gap) + h * cell
                    cls = ("i" if (n, c, h, w) == tuple(element)
                           else "s" if bool(mask[n, c, h, w]) else "")
                    attr = f' class="{cls}"' if cls else ""
                    out.append(f'<rect{attr} x="{x}" y="{y}" width="{cell}" height="{cell}" '
                               f'data-e="{n},{c},{h},{w}"/>')
    return out


def set_svg(normalized_ndim: int = 3, element=(0, 1, 0, 2), shape=(2, 3, 2, 4),
            x: torch.Tensor | None = None) -> str:
    """Two panels over one ``(N, C, H, W)`` block: LayerNorm's :math:`S_i` of ``element``
    for ``normalized_shape`` = the last ``normalized_ndim`` dims, and BatchNorm's.

    Rows are samples ``n``; in a row, channel ``c`` is a ``H x W`` grid.  Light cells are
    outside :math:`S_i`, blue cells in it, the dark cell is ``i`` itself.  Under each panel:
    :math:`|S_i|` and the mean and variance of the sample ``x`` (default :func:`sample`)
    over the set.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) != 4:
        raise ValueError(f"set_svg: expected a shape (N, C, H, W), got {shape}")
    if normalized_ndim not in (1, 2, 3):
        raise ValueError(f"set_svg: normalized_ndim must be 1, 2 or 3, got {normalized_ndim!r}")
    element = tuple(int(e) for e in element)
    if len(element) != 4 or not all(0 <= e < s for e, s in zip(element, shape)):
        raise ValueError(f"set_svg: element {element} is not an index of shape {shape}")
    x = sample(shape) if x is None else x
    N, C, H, W = shape
    cell, gap, left = 22, 8, 52
    grid_w = C * (W * cell + gap) - gap
    grid_h = N * (H * cell + gap) - gap
    width = left + grid_w + 14
    dims = _DIM_NAMES[4 - normalized_ndim:]
    ns = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
    panels = [("layer", normalized_ndim, f"LayerNorm, normalized_shape = {ns}"),
              ("batch", None, "BatchNorm (for contrast)")]
    body, y0, attrs = [], 8, {"normalized-ndim": str(normalized_ndim),
                              "element": ",".join(map(str, element))}
    for norm, k, title in panels:
        st = set_statistics(x, norm, element, k)
        body.append(f'<text class="h" x="4" y="{y0 + 14}">{_esc(title)}</text>')
        gy = y0 + 40
        for c in range(C):
            cx = left + c * (W * cell + gap) + W * cell / 2
            body.append(f'<text class="m q" x="{cx:.0f}" y="{gy - 5}">c = {c}</text>')
        for n in range(N):
            ny = gy + n * (H * cell + gap) + H * cell / 2 + 4
            body.append(f'<text class="q" x="4" y="{ny:.0f}">n = {n}</text>')
        body += _grid(st.mask, element, left, gy, cell, gap)
        ty = gy + grid_h + 20
        body.append(f'<text x="4" y="{ty}">|S<tspan dy="3" font-size="12">i</tspan>'
                    f'<tspan dy="-3">| = {st.size},  mean = {_num(st.mean)},  '
                    f'variance = {_num(st.var)}</tspan></text>')
        attrs[f"{norm}-size"] = str(st.size)
        y0 = ty + 16
    title = (f"LayerNorm over the last {normalized_ndim} dims and BatchNorm: the elements that "
             f"share statistics with element {element} of a tensor of shape {shape}")
    return _svg(width, y0, title, body, attrs)


# ------------------------------------------------------------------------------------------
# the numerics explorer
# ------------------------------------------------------------------------------------------
#: method name -> the variance function of normcore.stats (biased, over dim 0)
METHODS = {
    "naive": lambda v: stats.var_naive(v, 0),
    "two-pass": lambda v: stats.var_two_pass(v, 0),
    "welford": lambda v: stats.var_welford(v, 0),
}


class Numerics(NamedTuple):
    """One set of ``n`` values at ``offset`` (spread 1), its variance and normalized values
    computed by ``method`` in ``dtype``, and the float64 reference from the same values."""

    values: torch.Tensor       # the values, in dtype
    var: float                 # the variance by the method, in dtype
    var_exact: float           # float64, from the same (rounded) values
    xhat: torch.Tensor         # (x - mean) / sqrt(var + eps), all in dtype, as float64
    xhat_exact: torch.Tensor   # float64
    var_error: float           # |var - var_exact| / var_exact (nan if var is nan/inf)
    out_error: float           # max |xhat - xhat_exact| (nan if any output is not finite)


def numerics(offset: float, dtype: torch.dtype = torch.float32, method: str = "two-pass",
             n: int = 64, eps: float = 1e-5, seed: int = 0) -> Numerics:
    """Normalize ``n`` values ``offset + N(0, 1)`` with every step in ``dtype`` and the
    variance by ``method`` (a key of :data:`METHODS`); compare with float64."""
    if method not in METHODS:
        raise ValueError(f"numerics: method must be one of {list(METHODS)}, got {method!r}")
    g = torch.Generator().manual_seed(seed)
    v = (offset + torch.randn(n, generator=g, dtype=torch.float64)).to(dtype)
    exact64 = v.double()
    mu64 = exact64.mean()
    var64 = float(((exact64 - mu64) ** 2).mean())
    xhat64 = (exact64 - mu64) / math.sqrt(var64 + eps)
    var = METHODS[method](v)
    xhat = ((v - v.mean()) * torch.rsqrt(var + eps)).double()
    var_f = float(var)
    # (nan when the variance is not finite, or when rounding to dtype made the values equal)
    var_err = abs(var_f - var64) / var64 if math.isfinite(var_f) and var64 > 0 else float("nan")
    out_err = float((xhat - xhat64).abs().max()) if torch.isfinite(xhat).all() else float("nan")
    return Numerics(v, var_f, var64, xhat, xhat64, var_err, out_err)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def numerics_svg(offset: float, dtype: torch.dtype = torch.float32,
                 method: str = "two-pass") -> str:
    """One frame of the numerics explorer: the normalized values computed in ``dtype`` with
    the variance by ``method`` (y) against the exact ones (x), and the two errors."""
    r = numerics(offset, dtype, method)
    width, height = 360, 290
    px0, py0, size = 50, 64, 180          # plot area: x in [px0, px0+size], y likewise
    lim = 3.0

    def sx(v):
        return px0 + (v + lim) / (2 * lim) * size

    def sy(v):
        return py0 + size - (v + lim) / (2 * lim) * size

    body = [(f'<text class="h" x="4" y="18">{_esc(method)} variance in {_dtype_name(dtype)}, '
             f'mean offset {offset:g}</text>')]
    n = r.values.numel()
    overflow = float(r.values.double().abs().max()) ** 2 > torch.finfo(dtype).max
    if math.isfinite(r.var):
        vtxt = f"variance {r.var:.4g} (exact {r.var_exact:.4g})"
    elif overflow:      # x * x beyond the dtype's largest number: inf - inf = NaN
        vtxt = (f"variance NaN: x\u00b2 overflows {_dtype_name(dtype)} "
                f"(max {torch.finfo(dtype).max:.6g})")
    else:
        vtxt = f"variance {r.var} (exact {r.var_exact:.4g})"
    if r.var_exact == 0:  # rounding to dtype made all the values equal: no spread is left
        etxt = f"all {n} values round to {float(r.values[0]):g}: no spread left"
    elif math.isfinite(r.var):
        etxt = f"relative error of the variance: {r.var_error:.1e}"
    else:
        etxt = "relative error of the variance: not a number"
    body.append(f'<text x="4" y="38">{_esc(vtxt)}</text>')
    bad = not math.isfinite(r.var_error) or r.var_error > 0.1
    cls = ' class="bad"' if bad else ""
    body.append(f'<text x="4" y="56"{cls}>{_esc(etxt)}</text>')
    body.append(f'<rect x="{px0}" y="{py0}" width="{size}" height="{size}" '
                f'style="fill:#fff;stroke:#888"/>')
    body.append(f'<line x1="{sx(-lim)}" y1="{sy(-lim)}" x2="{sx(lim)}" y2="{sy(lim)}"/>')
    for t in (-2, 0, 2):
        body.append(f'<text class="m q" x="{sx(t):.0f}" y="{py0 + size + 15}">{t}</text>')
        body.append(f'<text class="e q" x="{px0 - 5}" y="{sy(t) + 4:.0f}">{t}</text>')
    body.append(f'<text class="m q" x="{px0 + size / 2:.0f}" y="{py0 + size + 31}">'
                f'exact normalized value</text>')
    body.append(f'<text class="m q" transform="rotate(-90)" x="{-(py0 + size / 2):.0f}" '
                f'y="14">computed</text>')
    if math.isfinite(r.out_error):
        for a, b in zip(r.xhat_exact.tolist(), r.xhat.tolist()):
            b = max(-lim, min(lim, b))
            body.append(f'<circle cx="{sx(a):.1f}" cy="{sy(b):.1f}" r="2.6"/>')
        otxt = f"largest output error {r.out_error:.1e}"
    else:
        otxt = "output: not a number (NaN or inf), so no dot can be drawn"
        body.append(f'<text class="m bad" x="{px0 + size / 2:.0f}" y="{py0 + size / 2:.0f}">'
                    f'NaN: no dot to draw</text>')
    ox = px0 + size + 12
    lines = ["largest output", "error:",
             (f"{r.out_error:.1e}" if math.isfinite(r.out_error) else "NaN")]
    if r.var_exact == 0 and math.isfinite(r.out_error):
        lines += ["", f"all {n} dots", "on one point"]
    for j, line in enumerate(lines):
        cls = ' class="bad"' if (j == 2 and (not math.isfinite(r.out_error) or r.out_error > 0.1)) \
            else ""
        body.append(f'<text{cls} x="{ox}" y="{py0 + 20 + 18 * j}">{_esc(line)}</text>')
    title = (f"Normalized values with the {method} variance in {_dtype_name(dtype)} at mean "
             f"offset {offset:g}, against the exact values; {otxt}")
    return _svg(width, height, title, body,
                {"method": method, "dtype": _dtype_name(dtype), "offset": f"{offset:g}"})


def _figure(figsize: tuple[float, float] | None, narrow: bool,
            subplots_adjust: dict) -> tuple[Figure, object]:
    """A figure of one axes: ``figsize`` (default 6.4 x 3.2) with the room of
    ``subplots_adjust`` for the legend at the right, or the phone layout."""
    if narrow:
        fig = Figure(figsize=figsize or (phone.WIDTH, 3.6), layout="constrained")
        return fig, fig.subplots()
    fig = Figure(figsize=figsize or (6.4, 3.2))
    ax = fig.subplots()
    fig.subplots_adjust(**subplots_adjust)  # legend: right
    return fig, ax


def _label(fig: Figure, ax, xlabel: str, ylabel: str, title: tuple[str, str], *,
           narrow: bool, ncol: int) -> None:
    """Axis labels, the title (``title`` is its two lines on a phone) and the legend, beside
    the axes or, on a phone, below them: outside the axes, so that it hides no data."""
    big, small = (9.5, phone.FONT) if narrow else (11, 10)
    ax.set_xlabel(xlabel, fontsize=big)
    ax.set_ylabel(ylabel, fontsize=big)
    ax.set_title(("\n" if narrow else " ").join(title), fontsize=10.5 if narrow else 12)
    ax.tick_params(labelsize=small)
    ax.grid(True, alpha=0.3)
    if narrow:
        phone.legend_below(fig, ax, ncol=ncol)
    else:
        ax.legend(fontsize=10, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)


def variance_error_figure(offsets: Sequence[float], errors: Mapping[str, Sequence[float]],
                          *, dtype_name: str = "float32",
                          figsize: tuple[float, float] | None = None,
                          narrow: bool = False) -> Figure:
    """Relative error of the variance (log scale) against the mean offset, one line per
    method.  Errors that are NaN or inf, or 1 and above (no digit right), are drawn on the
    top edge at 1 with a cross.

    ``figsize`` defaults to (6.4, 3.2), or (3.7, 3.6) when ``narrow``: the phone layout
    (:mod:`normcore.viz.phone`), the title on two lines and the legend below the axes."""
    fig, ax = _figure(figsize, narrow, dict(left=0.13, right=0.76, top=0.88, bottom=0.17))
    floor = 1e-9
    for name, errs in errors.items():
        ys = [min(1.0, e) if math.isfinite(e) else 1.0 for e in errs]
        ys = [max(floor, y) for y in ys]
        ax.plot(offsets, ys, "-o", ms=4, color=COLORS.get(name), label=name, lw=1.6)
        top = [(o, y) for o, y, e in zip(offsets, ys, errs) if not math.isfinite(e) or e >= 1]
        if top:
            ax.plot(*zip(*top), "x", ms=9, mew=2, color=COLORS.get(name))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(floor * 0.5, 3.0)
    _label(fig, ax, "mean offset (spread 1)", "relative error of variance",
           (f"Variance of 4096 values in {dtype_name},", "three ways"), narrow=narrow,
           ncol=len(errors))
    return fig


def grad_norms_figure(norms: Mapping[str, Sequence[float]], *,
                      figsize: tuple[float, float] | None = None,
                      narrow: bool = False) -> Figure:
    """Gradient norm of each layer's parameters (log scale) against the layer index, one
    line per model.

    ``figsize`` defaults to (6.4, 3.2), or (3.7, 3.6) when ``narrow``: the phone layout
    (:mod:`normcore.viz.phone`), the title on two lines and the legend below the axes."""
    fig, ax = _figure(figsize, narrow, dict(left=0.16, right=0.62, top=0.88, bottom=0.17))
    for name, vals in norms.items():
        ax.plot(range(1, len(vals) + 1), vals, "-o", ms=4, lw=1.6, color=COLORS.get(name),
                label=LABELS.get(name, name))
    ax.set_yscale("log")
    _label(fig, ax, r"layer $l$", "gradient norm",
           (r"Gradient norm of $\mathcal{F}$ per layer", "at initialization"), narrow=narrow,
           ncol=2)
    return fig
