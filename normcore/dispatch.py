r"""Which implementation runs a call: the reference, or the compiled kernels.

Every op has two implementations, no more:

* **the reference**: the formula in named steps (:mod:`normcore.core`) and its hand-derived
  backward (:mod:`normcore.grad`), plain torch ops for every dtype, device, size and memory
  format, under ``torch.compile``, ``torch.func`` and ``torch.export``;
* **the kernels**: the same formula as loops over each row, set or sample, compiled by numba
  (:mod:`normcore.loops`, :mod:`normcore.positions`; run by :mod:`normcore.kernels`), for
  float32 and float64 tensors on the CPU, in eager mode.

:func:`family` decides, from :data:`TABLE` and from nothing but the norm, the tensor's
dtype, device and memory format, whether a compiler or transform is recording, and the
switch :class:`use_kernels`.  Never from the values, the batch size or an environment
variable read per call: a sample's output is the same bits whatever its batch-mates are.
``NORMCORE_KERNELS=0`` in the environment sets the switch off once, at import.
:func:`explain` says which implementation a call takes, and why.
"""
from __future__ import annotations

import functools
import os

import torch

from .axes import Layout, layout

__all__ = ["TABLE", "DTYPES", "family", "fixed_family", "use_kernels", "kernels_enabled",
           "explain", "recording", "memory_format"]

#: (norm, memory format) -> the family of kernels that computes it; any other pair runs the
#: reference.  "rows": the sets are the rows of the ``(sets, |S|)`` view, gamma along each
#: row (LN, RMSNorm); "sets": a set is C/G channels of contiguous positions, gamma one value
#: per channel (GN, IN); "channels": BN one channel at a time, the ``(N, C, P)`` view;
#: "positions": ``channels_last`` memory, the ``(N, P, C)`` view (GN, IN per sample; BN as one
#: sample of every position).  (A BN input ``(N, C)`` has its channels innermost: it is read
#: as ``channels_last`` memory, :func:`memory_format`.)
TABLE = {
    ("layer", "contiguous"): "rows",
    ("rms", "contiguous"): "rows",
    ("group", "contiguous"): "sets",
    ("instance", "contiguous"): "sets",
    ("batch", "contiguous"): "channels",
    ("group", "channels_last"): "positions",
    ("instance", "channels_last"): "positions",
    ("batch", "channels_last"): "positions",
}
#: BN and IN with the running statistics (eval mode), forward and backward: one pass over x
#: (and g) per channel (:func:`normcore.loops.fixed_by_channels`) or by chunks of positions
#: (:func:`normcore.positions.fixed_forward`, :func:`normcore.positions.backward_fixed`)
FIXED = {("batch", "contiguous"): "fixed", ("instance", "contiguous"): "fixed",
         ("batch", "channels_last"): "fixed", ("instance", "channels_last"): "fixed"}
#: the dtypes the kernels read and write
DTYPES = (torch.float32, torch.float64)

_STATE = {"kernels": os.environ.get("NORMCORE_KERNELS", "1") != "0", "numba": None}


class use_kernels:
    """Switch the compiled kernels on or off: ``normcore.use_kernels(False)`` for the rest of
    the process, or ``with normcore.use_kernels(False): ...`` for a block (the previous
    setting comes back at its end).  Off, every call runs the reference.

    Examples:
        >>> import normcore
        >>> with normcore.use_kernels(False):
        ...     normcore.kernels_enabled()
        False
    """

    def __init__(self, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"use_kernels takes True or False, got {enabled!r}")
        self.previous = _STATE["kernels"]
        _STATE["kernels"] = enabled

    def __enter__(self) -> use_kernels:
        return self

    def __exit__(self, *exc) -> None:
        _STATE["kernels"] = self.previous


def numba_installed() -> bool:
    """Whether numba (the extra ``normcore[fast]``) can be imported; asked once."""
    if _STATE["numba"] is None:
        try:
            import numba  # noqa: F401
            import numpy  # noqa: F401
        except ImportError:
            _STATE["numba"] = False
        else:
            _STATE["numba"] = True
    return bool(_STATE["numba"])


def kernels_enabled() -> bool:
    """Whether the kernels run where :data:`TABLE` has them: switched on and installed."""
    return bool(_STATE["kernels"]) and numba_installed()


def recording() -> bool:
    """Whether a compiler, exporter, tracer or ``torch.func`` transform is recording: the
    kernels write into numpy views of fresh tensors, which none of them can follow."""
    return (torch.compiler.is_compiling() or torch.compiler.is_exporting()
            or torch.jit.is_tracing() or torch._C._are_functorch_transforms_active())


def memory_format(x: torch.Tensor, norm: str = "") -> str | None:
    """``"contiguous"``, ``"channels_last"`` (4-d or 5-d), or None for any other strides.  For
    BN a contiguous ``(N, C)`` is ``"channels_last"``: its channels are innermost, and it is
    one sample of N positions."""
    if x.is_contiguous():
        return "channels_last" if x.dim() == 2 and norm == "batch" else "contiguous"
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    return "channels_last" if fmt is not None and x.is_contiguous(memory_format=fmt) else None


@functools.lru_cache(maxsize=1024)
def standard(lay: Layout) -> bool:
    """Whether ``lay`` is its norm's own layout (:func:`normcore.axes.layout`), the one the
    kernels are written for; a layout of other sets (the exercises' wrong sets,
    :func:`normcore.axes.roles_layout`) runs the reference."""
    if lay.norm not in ("batch", "layer", "instance", "group", "rms"):
        return False
    k = len(lay.reduce_dims) if lay.norm in ("layer", "rms") else None
    try:
        return layout(lay.norm, lay.shape, lay.num_groups, k) == lay
    except ValueError:
        return False


def _conditions(table: dict, lay: Layout, x: torch.Tensor) -> list[tuple[str, bool]]:
    fmt = memory_format(x, lay.norm)
    return [
        ("the kernels are switched on (normcore.use_kernels)", bool(_STATE["kernels"])),
        ("numba is installed (normcore[fast])", numba_installed()),
        (f"the device is the CPU (it is {x.device.type})", x.device.type == "cpu"),
        (f"the dtype is float32 or float64 (it is {x.dtype})", x.dtype in DTYPES),
        ("the input is not empty", x.numel() > 0),
        ("no compiler, exporter, tracer or torch.func transform is recording", not recording()),
        (f"the layout is {lay.norm!r}'s own (not the sets of another)", standard(lay)),
        (f"the table has ({lay.norm!r}, {fmt!r})", (lay.norm, fmt) in table),
    ]


def _family(table: dict, lay: Layout, x: torch.Tensor) -> str | None:
    """The table's family when every condition of :func:`_conditions` holds (the list
    :func:`explain` prints: one list, so that the two cannot disagree), else None.  A
    compiler or transform that records gets None at once: it traces nothing else here."""
    if recording() or not all(ok for _, ok in _conditions(table, lay, x)):
        return None
    return table[(lay.norm, memory_format(x, lay.norm))]


def family(lay: Layout, x: torch.Tensor) -> str | None:
    """The kernels' family that computes ``lay`` on ``x`` in training mode (a value of
    :data:`TABLE`), or None: the reference."""
    return _family(TABLE, lay, x)


def fixed_family(lay: Layout, x: torch.Tensor) -> str | None:
    """``"fixed"`` when the kernels compute the backward of BN or IN with the running
    statistics on ``x`` (:data:`FIXED`), or None: the reference."""
    return _family(FIXED, lay, x)


def explain(lay: Layout, x: torch.Tensor, training: bool = True) -> str:
    """Which implementation a call of ``lay`` on ``x`` takes, and every condition that
    decided it (``training=False``: BN and IN with the running statistics).

    Examples:
        >>> import torch, normcore
        >>> from normcore.axes import layout
        >>> x = torch.randn(8, 4, 16, dtype=torch.float16)
        >>> print(normcore.explain(layout("layer", x.shape, normalized_ndim=1), x))
        reference
          yes  the kernels are switched on (normcore.use_kernels)
          yes  numba is installed (normcore[fast])
          yes  the device is the CPU (it is cpu)
          no   the dtype is float32 or float64 (it is torch.float16)
          yes  the input is not empty
          yes  no compiler, exporter, tracer or torch.func transform is recording
          yes  the layout is 'layer''s own (not the sets of another)
          yes  the table has ('layer', 'contiguous')
    """
    table = TABLE if training else FIXED
    found = _family(table, lay, x)
    head = "reference" if found is None else f"kernels ({found})"
    rows = [f"  {'yes' if ok else 'no ':<4} {what}" for what, ok in _conditions(table, lay, x)]
    return "\n".join([head, *rows])
