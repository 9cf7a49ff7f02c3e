r"""The docstrings of :mod:`normcore.functional`'s ops, in torch's form (docstrings this long
are kept apart from the code, as torch keeps many of its own in ``torch/_torch_docs.py``).

:func:`documented` gives an op the docstring of its name in :data:`DOCS` and fills in its
signature's defaults (:func:`normcore.defaults.fill_defaults`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ._checks import WS_CONVENTIONS
from .defaults import _shown as shown  # a default as fill_defaults writes it
from .defaults import fill_defaults

__all__ = ["DOCS", "documented"]

T = TypeVar("T", bound=Callable[..., Any])

#: The docstring of each op of :mod:`normcore.functional`, by name.
DOCS: dict[str, str] = {}

DOCS["normalize"] = r"""
Normalize ``x`` over the sets :math:`S_i` of a layout: the one primitive of every op.

``lay`` (:func:`normcore.axes.layout`) says which elements share :math:`\mu_i` and
:math:`\sigma_i^2` and where :math:`\gamma, \beta` live; the formula is
:func:`normcore.core.normalize_formula`'s:

.. math::

    y_i = \gamma\,(x_i - \mu_i)\, r_i + \beta, \qquad
    r_i = \frac{1}{\sqrt{\sigma_i^2 + \epsilon}}

The ops of this module are this function on their layout.  Given ``mean`` and ``var``, it uses
them instead of the statistics of ``x`` (eval mode).  With a gradient of the normalization to
compute (the sets' statistics, the biased variance, eps inside the square root),
``backward="derived"`` runs :class:`normcore.grad.Normalize`, the hand-derived backward (itself
differentiable).  Which implementation computes it, the reference or the compiled kernels, is
:func:`normcore.dispatch.family`'s choice (:func:`normcore.explain` says which and why).  The
output takes torch's memory format.

Args:
    x (Tensor): the input, of the shape ``lay`` was made for.
    lay (normcore.axes.Layout): the sets :math:`S_i`, from :func:`normcore.axes.layout`.
    eps (float): :math:`\epsilon`, added to the variance. Unlike the ops, ``0`` is accepted: the
        book uses it to show what :math:`\epsilon` is for.
    weight (Tensor or None): :math:`\gamma`, of shape ``lay.affine_shape``. Default: {default}
    bias (Tensor or None): :math:`\beta`, of shape ``lay.affine_shape``. Default: {default}
    mean (Tensor or None): a mean to use instead of the sets' (keyword only). Default: {default}
    var (Tensor or None): a variance to use instead of the sets' (keyword only).
        Default: {default}
    correction (int): ``0`` divides :math:`M_2` by :math:`K` (the biased variance), ``1`` by
        :math:`K - 1`. Default: {default}
    eps_mode (str): ``"inside"``, :math:`1/\sqrt{\sigma^2 + \epsilon}`, or ``"outside"``,
        :math:`1/(\sigma + \epsilon)`. Default: {default}
    backward (str): ``"derived"`` or ``"autograd"``, see :mod:`normcore.functional`.
        Default: {default}

Returns:
    Normalized: ``(output, mean, var)``, the output and the statistics it used (in the layout's
    view, ``keepdim`` shape; ``var`` is the mean square for RMSNorm).

Examples:
    >>> import normcore.functional as F
    >>> from normcore.axes import layout
    >>> x = torch.randn(8, 3, 5, 5)
    >>> out = F.normalize(x, layout("batch", x.shape), eps=1e-3)
    >>> out.output.shape, out.mean.shape
    (torch.Size([8, 3, 5, 5]), torch.Size([1, 3, 1, 1]))
    >>> torch.allclose(out.output, torch.nn.functional.batch_norm(
    ...     x, None, None, training=True, eps=1e-3), atol=1e-4)
    True
"""

DOCS["batch_norm"] = r"""
Batch normalization (Ioffe & Szegedy 2015) of an input :math:`(N, C, *)`.

An element shares its statistics with every element of its channel, over the batch and every
position: :math:`S_i = \{k \mid k_C = i_C\}`, of size :math:`K = N \cdot` (the spatial size).  In
training (``training=True``), :math:`\mu_i, \sigma_i^2` are the batch's (the biased variance), and
the running buffers, if given, are updated in place with the batch mean and the *unbiased*
variance:

.. math::

    y_i = \gamma_c\,\frac{x_i - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}} + \beta_c

.. math::

    \hat\mu \leftarrow (1-\alpha)\,\hat\mu + \alpha\,\mu, \qquad
    \hat\sigma^2 \leftarrow (1-\alpha)\,\hat\sigma^2 + \alpha\,\sigma^2_{\text{unbiased}}

With ``training=False``, :math:`\hat\mu, \hat\sigma^2` take the place of :math:`\mu_i, \sigma_i^2`:
the map is then affine per channel, and ``backward="derived"`` runs it as one Function
(:class:`normcore.frozen.FixedStatistics`, which keeps only the input for its backward);
no gradient reaches the buffers, and buffers that require grad raise, as in torch.
An empty batch (:math:`N = 0`) gives an empty output and leaves the buffers as they are, as torch
does.

Args:
    input (Tensor): :math:`x`, of shape :math:`(N, C, *)`.
    running_mean (Tensor or None): :math:`\hat\mu`, of shape :math:`(C,)`: read in eval, updated in
        place in training; ``None`` (with ``running_var``) for no buffers.
    running_var (Tensor or None): :math:`\hat\sigma^2`, of shape :math:`(C,)`.
    weight (Tensor or None): :math:`\gamma`, of shape :math:`(C,)`; ``None`` for 1.
        Default: {default}
    bias (Tensor or None): :math:`\beta`, of shape :math:`(C,)`; ``None`` for 0.
        Default: {default}
    training (bool): normalize with the batch's statistics (and update the buffers), or with the
        buffers. Default: {default}
    momentum (float): :math:`\alpha`, the weight of the batch in the buffers, in :math:`[0, 1]`.
        Default: {default}
    eps (float): :math:`\epsilon > 0`, added to the variance. Default: {default}
    backward (str): ``"derived"`` or ``"autograd"``, see :mod:`normcore.functional`.
        Default: {default}

Returns:
    Tensor: :math:`y`, of the shape and dtype of ``input``.

Shape:
    - Input: :math:`(N, C, *)`; in training, more than one value per channel.
    - Output: :math:`(N, C, *)` (same shape as input)

Differs from torch:
    - ``eps <= 0`` raises a ``ValueError`` in eval too (torch refuses it in training only; with
      ``eps = 0`` a constant channel divides 0 by 0).
    - ``momentum`` outside :math:`[0, 1]` raises a ``ValueError`` (torch takes it; the buffers are
      then no weighted average).
    - The keyword-only ``backward`` (torch has none).

Examples:
    >>> import normcore.functional as F
    >>> x = torch.randn(8, 3, 5, 5)
    >>> mean, var = torch.zeros(3), torch.ones(3)
    >>> y = F.batch_norm(x, mean, var, training=True)
    >>> mean_t, var_t = torch.zeros(3), torch.ones(3)
    >>> y_t = torch.nn.functional.batch_norm(x, mean_t, var_t, training=True)
    >>> torch.allclose(y, y_t, atol=1e-4), torch.allclose(var, var_t)
    (True, True)
"""

DOCS["instance_norm"] = r"""
Instance normalization (Ulyanov et al. 2016) of an input :math:`(N, C, *)`.

An element shares its statistics with the other positions of its sample and channel:
:math:`S_i = \{k \mid k_N = i_N,\ k_C = i_C\}`, of size :math:`K` = the spatial size.

.. math::

    y_i = \gamma_c\,\frac{x_i - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}} + \beta_c

With ``use_input_stats=True``, running buffers are updated in place as in :func:`batch_norm`,
with the instances' statistics averaged over the batch (as torch does); with ``False`` they are
used, as BatchNorm's in eval.  An empty batch gives an empty output, unless it would update
running buffers (with a mean over no instance): that raises.

Args:
    input (Tensor): :math:`x`, of shape :math:`(N, C, *)`, at least one spatial dim.
    running_mean (Tensor or None): :math:`\hat\mu`, of shape :math:`(C,)`. Default: {default}
    running_var (Tensor or None): :math:`\hat\sigma^2`, of shape :math:`(C,)`. Default: {default}
    weight (Tensor or None): :math:`\gamma`, of shape :math:`(C,)`; ``None`` for 1.
        Default: {default}
    bias (Tensor or None): :math:`\beta`, of shape :math:`(C,)`; ``None`` for 0.
        Default: {default}
    use_input_stats (bool): normalize with each instance's statistics (and update the buffers), or
        with the buffers. Default: {default}
    momentum (float): :math:`\alpha`, the weight of the batch in the buffers, in :math:`[0, 1]`.
        Default: {default}
    eps (float): :math:`\epsilon > 0`, added to the variance. Default: {default}
    backward (str): ``"derived"`` or ``"autograd"``, see :mod:`normcore.functional`.
        Default: {default}

Returns:
    Tensor: :math:`y`, of the shape and dtype of ``input``.

Shape:
    - Input: :math:`(N, C, *)`, more than one spatial element when normalizing with the input's
      statistics.
    - Output: :math:`(N, C, *)` (same shape as input)

Differs from torch:
    - ``eps <= 0`` raises a ``ValueError`` (torch takes it).
    - ``momentum`` outside :math:`[0, 1]` raises a ``ValueError`` (torch takes it).
    - An empty batch that would update running buffers raises
      :class:`~normcore.errors.EmptyBatchError` and leaves them as they were (torch writes NaN into
      them, or raises ``IndexError`` with ``weight``); with a ``weight`` and nothing to update, the
      output is empty (torch raises).
    - The keyword-only ``backward`` (torch has none).

Examples:
    >>> import normcore.functional as F
    >>> x = torch.randn(4, 3, 10)
    >>> y = F.instance_norm(x)
    >>> torch.allclose(y, torch.nn.functional.instance_norm(x), atol=1e-4)
    True
    >>> y.mean(-1).abs().max() < 1e-6
    tensor(True)
"""

DOCS["layer_norm"] = r"""
Layer normalization (Ba et al. 2016) over the trailing ``normalized_shape`` dims.

An element shares its statistics with every element of the same leading index: for an input
:math:`(N, C, *)` normalized over :math:`(C, *)`, every element of its sample,
:math:`S_i = \{k \mid k_N = i_N\}`.  :math:`\gamma, \beta` have one value per element of
``normalized_shape``, the same for every sample.  Training and eval are the same.

.. math::

    y_i = \gamma\,\frac{x_i - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}} + \beta

Args:
    input (Tensor): :math:`x`, of shape ``(*, *normalized_shape)``.
    normalized_shape (int or tuple of int): the input's last dims, which each set spans.
    weight (Tensor or None): :math:`\gamma`, of shape ``normalized_shape``; ``None`` for 1.
        Default: {default}
    bias (Tensor or None): :math:`\beta`, of shape ``normalized_shape``; ``None`` for 0.
        Default: {default}
    eps (float): :math:`\epsilon > 0`, added to the variance. Default: {default}
    backward (str): ``"derived"`` or ``"autograd"``, see :mod:`normcore.functional`.
        Default: {default}

Returns:
    Tensor: :math:`y`, of the shape and dtype of ``input``.

Shape:
    - Input: ``(*, *normalized_shape)``
    - Output: same shape as input

Differs from torch:
    - ``eps <= 0`` raises a ``ValueError`` (torch takes it).
    - The keyword-only ``backward`` (torch has none).

Examples:
    >>> import normcore.functional as F
    >>> x = torch.randn(2, 7, 16)                    # (N, T, C) tokens
    >>> w, b = torch.randn(16), torch.randn(16)
    >>> y = F.layer_norm(x, (16,), w, b)
    >>> torch.allclose(y, torch.nn.functional.layer_norm(x, (16,), w, b), atol=1e-4)
    True
"""

DOCS["rms_norm"] = r"""
RMS normalization (Zhang & Sennrich 2019): LayerNorm's sets, no centering, no :math:`\beta`.

Over LayerNorm's set :math:`S_i` (the trailing ``normalized_shape`` dims), the mean square takes
the place of the variance, and nothing is subtracted:

.. math::

    y_i = \gamma\,\frac{x_i}{\sqrt{\frac1K \sum_{k \in S_i} x_k^2 + \epsilon}}

Args:
    input (Tensor): :math:`x`, of shape ``(*, *normalized_shape)``.
    normalized_shape (int or tuple of int): the input's last dims, which each set spans.
    weight (Tensor or None): :math:`\gamma`, of shape ``normalized_shape``; ``None`` for 1.
        Default: {default}
    eps (float or None): :math:`\epsilon > 0`, added to the mean square; ``None`` takes the
        machine epsilon of the compute dtype (``rms_eps``, as torch). Default: {default}
    backward (str): ``"derived"`` or ``"autograd"``, see :mod:`normcore.functional`.
        Default: {default}

Returns:
    Tensor: :math:`y`, of the shape and dtype of ``input``.

Shape:
    - Input: ``(*, *normalized_shape)``
    - Output: same shape as input

Differs from torch:
    - ``eps <= 0`` raises a ``ValueError`` (torch takes it, a negative one too).
    - The keyword-only ``backward`` (torch has none).

Examples:
    >>> import normcore.functional as F
    >>> x, w = torch.randn(2, 7, 16), torch.randn(16)
    >>> y = F.rms_norm(x, (16,), w)
    >>> torch.allclose(y, torch.nn.functional.rms_norm(x, (16,), w), atol=1e-4)
    True
"""

DOCS["group_norm"] = r"""
Group normalization (Wu & He 2018) of an input :math:`(N, C, *)`.

The :math:`C` channels are split into :math:`G` = ``num_groups`` groups of :math:`C/G` contiguous
channels; an element shares its statistics with every element of its sample and group,
:math:`S_i = \{k \mid k_N = i_N,\ \lfloor k_C / (C/G) \rfloor = \lfloor i_C / (C/G) \rfloor\}`,
of size :math:`K = (C/G) \cdot` (the spatial size).  :math:`\gamma, \beta` are per channel.
:math:`G = 1` is LayerNorm over :math:`(C, *)` with per-channel :math:`\gamma, \beta`;
:math:`G = C` is InstanceNorm.

.. math::

    y_i = \gamma_c\,\frac{x_i - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}} + \beta_c

Args:
    input (Tensor): :math:`x`, of shape :math:`(N, C, *)`.
    num_groups (int): :math:`G`, which divides :math:`C`.
    weight (Tensor or None): :math:`\gamma`, of shape :math:`(C,)`; ``None`` for 1.
        Default: {default}
    bias (Tensor or None): :math:`\beta`, of shape :math:`(C,)`; ``None`` for 0.
        Default: {default}
    eps (float): :math:`\epsilon > 0`, added to the variance. Default: {default}
    backward (str): ``"derived"`` or ``"autograd"``, see :mod:`normcore.functional`.
        Default: {default}

Returns:
    Tensor: :math:`y`, of the shape and dtype of ``input``.

Shape:
    - Input: :math:`(N, C, *)`
    - Output: :math:`(N, C, *)` (same shape as input)

Differs from torch:
    - ``eps <= 0`` raises a ``ValueError`` (torch takes it).
    - The keyword-only ``backward`` (torch has none).

Examples:
    >>> import normcore.functional as F
    >>> x = torch.randn(2, 6, 4, 4)
    >>> y = F.group_norm(x, 3)
    >>> torch.allclose(y, torch.nn.functional.group_norm(x, 3), atol=1e-4)
    True
    >>> torch.allclose(F.group_norm(x, 6), F.instance_norm(x), atol=1e-6)
    True
"""

DOCS["weight_standardize"] = r"""
Weight Standardization (Qiao et al. 2019): each output channel's filter over its fan-in.

Of a weight :math:`\mathbf{W}` of shape :math:`(C_{\text{out}}, C_{\text{in}}, *)`, the filter
:math:`\mathbf{W}_c` of output channel :math:`c` (its :math:`F` weights) is standardized
with its own mean :math:`\mu_c` and standard deviation :math:`\sigma_c`: a LayerNorm of the weight
over every dim but the first, without :math:`\gamma, \beta`. Three conventions are in use, and they
differ in the variance and where :math:`\epsilon` goes (:data:`WS_CONVENTIONS`):

============  =================================================================  ================
convention    :math:`\hat{\mathbf{W}}_{c,j}`                                     default ``eps``
============  =================================================================  ================
``original``  :math:`(\mathbf{W}_{c,j} - \mu_c) / (\sigma_c + \epsilon)`         <eps:original>
``bit``       :math:`(\mathbf{W}_{c,j} - \mu_c) / \sqrt{\sigma_c^2 + \epsilon}`  <eps:bit>
``timm``      :math:`(\mathbf{W}_{c,j} - \mu_c) / \sqrt{\sigma_c^2 + \epsilon}`  <eps:timm>
============  =================================================================  ================

with the unbiased :math:`\sigma_c` (divided by :math:`F - 1`) in ``original`` (Qiao et al.'s code),
the biased one in ``bit`` (Kolesnikov et al. 2020) and ``timm``.  The hand-derived backward is
:class:`normcore.grad.WeightStandardize`.

Args:
    weight (Tensor): :math:`\mathbf{W}`, a conv or linear weight, at least 2 dims.
    eps (float or None): :math:`\epsilon > 0`; ``None`` takes the convention's.
        Default: {default}
    convention (str): ``"original"``, ``"bit"`` or ``"timm"`` (keyword only). Default: {default}
    backward (str): ``"derived"`` or ``"autograd"``, see :mod:`normcore.functional`.
        Default: {default}

Returns:
    Tensor: :math:`\hat{\mathbf{W}}`, of the shape and dtype of ``weight``.

Shape:
    - Input: :math:`(C_{\text{out}}, C_{\text{in}}, *)`
    - Output: same shape as input

Examples:
    >>> import normcore.functional as F
    >>> w = torch.randn(8, 4, 3, 3)
    >>> w_hat = F.weight_standardize(w, convention="bit")
    >>> torch.allclose(w_hat, F.layer_norm(w, w.shape[1:], eps=1e-10), atol=1e-4)
    True
    >>> w_hat.flatten(1).mean(1).abs().max() < 1e-6
    tensor(True)
"""

DOCS["instance_stats"] = r"""
Each instance's mean and standard deviation over the spatial dims, :math:`\mu_{nc}` and
:math:`\sqrt{\sigma_{nc}^2 + \epsilon}`.

InstanceNorm's statistics (the biased variance), which carry gradients.

Args:
    input (Tensor): :math:`x`, of shape :math:`(N, C, *)` with at least one spatial dim.
    eps (float): :math:`\epsilon \ge 0`, added to the variance; ``0`` gives the plain standard
        deviation. Default: {default}
    caller (str): the name the error messages give. Default: {default}

Returns:
    tuple of Tensor: ``(mean, std)``, each of shape :math:`(N, C, 1, \ldots)`.

Examples:
    >>> import normcore.functional as F
    >>> x = torch.randn(2, 3, 4, 4)
    >>> mean, std = F.instance_stats(x)
    >>> mean.shape
    torch.Size([2, 3, 1, 1])
    >>> torch.allclose(std, x.std((2, 3), correction=0, keepdim=True))
    True
"""

DOCS["adaptive_instance_norm"] = r"""
Adaptive Instance Normalization (Huang & Belongie 2017): give each channel of each sample of
``input`` the mean and standard deviation of that channel of ``style``.

For content :math:`x` and style :math:`v`, with InstanceNorm's statistics (biased variance, over
the spatial dims) of each:

.. math::

    \operatorname{AdaIN}(x, v)_{nc} = s_{nc}(v)\,
        \frac{x_{nc} - \mu_{nc}(x)}{\sqrt{\sigma_{nc}^2(x) + \epsilon}} + \mu_{nc}(v),
    \qquad s_{nc}(v) = \sqrt{\sigma_{nc}^2(v) + \epsilon}.

:math:`\epsilon` on both sides makes ``AdaIN(x, x) == x``.  With ``alpha`` < 1 the output is
``alpha * AdaIN(x, v) + (1 - alpha) * x``, the paper's content-style trade-off; for this formula it
is the same as interpolating the statistics themselves. torch has no AdaIN.

Args:
    input (Tensor): the content :math:`x`, of shape :math:`(N, C, *)` with at least one spatial
        dim.
    style (Tensor): the style :math:`v`, of shape :math:`(N, C, *)`: the same :math:`N` and
        :math:`C`; its spatial size may differ.
    alpha (float): in :math:`[0, 1]`; 1 is full stylization, 0 returns ``input``.
        Default: {default}
    eps (float): :math:`\epsilon > 0`, added to both variances. Default: {default}

Returns:
    Tensor: of the shape and dtype of ``input`` (float16 / bfloat16 computed in float32).

Shape:
    - Input: :math:`(N, C, *)`, style :math:`(N, C, *)`
    - Output: :math:`(N, C, *)` (same shape as input)

Examples:
    >>> import normcore.functional as F
    >>> x, v = torch.randn(2, 3, 8, 8), 5 + 2 * torch.randn(2, 3, 16, 16)
    >>> y = F.adaptive_instance_norm(x, v)
    >>> mean_y, std_y = F.instance_stats(y)
    >>> mean_v, std_v = F.instance_stats(v)
    >>> torch.allclose(mean_y, mean_v, atol=1e-4), torch.allclose(std_y, std_v, atol=1e-4)
    (True, True)
"""

DOCS["dyt"] = r"""
Dynamic Tanh (Zhu, Chen, He, LeCun & Liu 2025): an element-wise stand-in for LayerNorm, with no
statistics.

.. math::

    \mathrm{DyT}(x) = \gamma \tanh(\alpha_{\mathrm{DyT}}\, x) + \beta

:math:`\gamma, \beta` live where LayerNorm's do (the trailing dims, ``channels_last=True``) or one
per channel of dim 1 of an :math:`(N, C, *)` input (``channels_last=False``, the paper's code for
ConvNeXt).  With a gradient to compute, ``backward="derived"`` runs
:class:`normcore.grad_dyt.DyTFunction`, the hand-derived backward.  torch has no DyT.

Args:
    input (Tensor): :math:`x`: any shape with ``channels_last=True``, :math:`(N, C, *)` otherwise.
    alpha (Tensor): :math:`\alpha_{\mathrm{DyT}}`, the learned scalar, a tensor of one element, of
        shape ``(1,)`` as the paper's code keeps it, or ``()``.
    weight (Tensor or None): :math:`\gamma`: the shape of the input's trailing dims
        (``channels_last=True``) or :math:`(C,)`; ``None`` for 1. Default: {default}
    bias (Tensor or None): :math:`\beta`, of ``weight``'s shape; ``None`` for 0.
        Default: {default}
    channels_last (bool): where :math:`\gamma, \beta` live (keyword only). Default: {default}
    normalized_shape (int, tuple of int or None): if given, the input's trailing dims (or
        :math:`(C,)`) must equal it even without weight and bias (keyword only). Default: {default}
    backward (str): ``"derived"`` or ``"autograd"``, see :mod:`normcore.functional`.
        Default: {default}

Returns:
    Tensor: of the shape and dtype of ``input`` (float16 / bfloat16 computed in float32).

Shape:
    - Input: :math:`(*)`, or :math:`(N, C, *)` with ``channels_last=False``
    - Output: same shape as input

Examples:
    >>> import normcore.functional as F
    >>> x = torch.randn(2, 7, 16)
    >>> alpha, w, b = torch.tensor([0.5]), torch.randn(16), torch.randn(16)
    >>> y = F.dyt(x, alpha, w, b)
    >>> torch.allclose(y, w * torch.tanh(alpha * x) + b, atol=1e-6)
    True
    >>> F.dyt(torch.randn(2, 3, 4, 4), alpha, torch.ones(3), channels_last=False).shape
    torch.Size([2, 3, 4, 4])
"""



def _ws_eps_column(doc: str) -> str:
    """Weight Standardization's table: each convention's default eps, read from
    :data:`~normcore._checks.WS_CONVENTIONS` (the papers' values, written there once)."""
    for name, conv in WS_CONVENTIONS.items():
        doc = doc.replace(f"<eps:{name}>", shown(conv["eps"]))
    return doc


DOCS["weight_standardize"] = _ws_eps_column(DOCS["weight_standardize"])


def documented(fn: T) -> T:
    """Give the op ``fn`` its docstring, :data:`DOCS` ``[fn.__name__]``, with the
    signature's defaults written in (a name without a docstring is a ``KeyError`` at
    import)."""
    fn.__doc__ = DOCS[fn.__name__]
    return fill_defaults(fn)
