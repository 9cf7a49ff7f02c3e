r"""Small, seeded experiments behind the chapters' widgets and claims.

Running-statistics simulator
----------------------------
:func:`simulate_running_stats` trains one :class:`normcore.nn.BatchNorm1d` (no affine
parameters) on batches drawn from a known normal distribution whose mean and variance may
*shift* partway through, and records, after every step,

* the population values :math:`\mu_t, \sigma_t^2` the batch was drawn from;
* the batch's own mean, biased variance (what train mode divides by) and unbiased variance
  (what is fed to ``running_var``);
* the module's ``running_mean``, ``running_var`` and ``num_batches_tracked`` buffers;
* ``running_var_biased``: what a layer that stores the *biased* batch variance would hold
  (the d2l.ai and labml.ai implementations do), updated with the same factor by
  :func:`normcore.stats.ema_update_`;
* two gaps on held-out data from the current population, as root mean squares over every
  held-out element: ``gap_train_eval`` between train-mode outputs (each held-out batch of
  ``batch_size`` normalized by its own statistics) and eval-mode outputs (normalized by the
  running buffers), and ``gap_eval_ideal`` between eval-mode outputs and the ideal
  :math:`(x - \mu_t)/\sqrt{\sigma_t^2 + \epsilon}`.

Each of the ``channels`` channels is an independent replica of the same experiment: a
BatchNorm treats its channels independently, so one module with 64 channels is 64 runs at
once.  Plots show channel 0; claims are checked on averages over the channels.

The data depend only on ``(seed, batch_size, steps, channels, heldout)``: the same standard
normal draws are scaled and shifted into both populations, so runs that differ only in
``momentum`` (or in ``shift``) see the same batches, and their differences are the
momentum's (or the shift's) alone.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from .. import data
from .. import functional as F
from .. import stats
from ..nn import BatchNorm1d

__all__ = [
    "Population", "BEFORE", "AFTER", "MOMENTA", "BATCH_SIZES", "STEPS", "SHIFT_STEP",
    "RunningSimulation", "simulate_running_stats", "simulation_batches", "running_stats_grid",
    "ema_std", "recovery_steps", "first_step_within",
]


@dataclass(frozen=True)
class Population:
    """A normal distribution :math:`N(\\mu, \\sigma^2)` for every channel."""

    mean: float
    var: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean) and math.isfinite(self.var)) or self.var <= 0:
            raise ValueError(f"Population needs a finite mean and a finite var > 0, got {self}")

    @property
    def std(self) -> float:
        return math.sqrt(self.var)


#: The distribution before the shift: far from the buffers' initial (0, 1), so the warm-up
#: lag is visible.
BEFORE = Population(mean=2.0, var=4.0)
#: The distribution after the shift.
AFTER = Population(mean=-1.0, var=1.0)
#: The simulator widget's grid.
MOMENTA = (0.01, 0.1, 0.5, None)
BATCH_SIZES = (2, 8, 64)
STEPS = 400
SHIFT_STEP = 200


@dataclass(frozen=True, eq=False)
class RunningSimulation:
    """The record of one run of :func:`simulate_running_stats` (float64 tensors).

    Step ``t`` runs from 1 to ``steps``; row ``t - 1`` of every ``(steps, ...)`` tensor holds
    the values of step ``t`` (the running buffers *after* its update).  The buffers' values
    before the first step are ``initial_mean`` and ``initial_var`` (torch's 0 and 1).
    """

    momentum: float | None
    batch_size: int
    shift: bool
    seed: int
    steps: int
    shift_step: int
    channels: int
    heldout: int
    eps: float
    before: Population
    after: Population
    initial_mean: float
    initial_var: float
    true_mean: torch.Tensor          # (steps,)
    true_var: torch.Tensor           # (steps,)
    batch_mean: torch.Tensor         # (steps, channels)
    batch_var: torch.Tensor          # (steps, channels) biased: M2 / n
    batch_var_unbiased: torch.Tensor  # (steps, channels)  M2 / (n - 1)
    running_mean: torch.Tensor       # (steps, channels)
    running_var: torch.Tensor        # (steps, channels)
    running_var_biased: torch.Tensor  # (steps, channels) a biased-storing layer's buffer
    num_batches_tracked: torch.Tensor  # (steps,) int64
    gap_train_eval: torch.Tensor     # (steps,)
    gap_eval_ideal: torch.Tensor     # (steps,)

    @property
    def step(self) -> torch.Tensor:
        """The step numbers ``1 .. steps``."""
        return torch.arange(1, self.steps + 1)

    @property
    def label(self) -> str:
        m = "None (cumulative)" if self.momentum is None else f"{self.momentum:g}"
        s = f"shift after step {self.shift_step}" if self.shift else "no shift"
        return f"momentum={m}, batch size {self.batch_size}, {s}"


def _check_int(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"simulate_running_stats: {name} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"simulate_running_stats: {name} must be >= {low}, got {value}")
    return value


def _draw(batch_size, shift, seed, steps, shift_step, channels, heldout, before, after):
    dt = torch.float64
    gen = data.generator(seed)
    z = data.normal(gen, (steps, batch_size, channels))
    z_held = data.normal(gen, (heldout, channels))
    post = after if shift else before
    is_post = torch.arange(1, steps + 1) > shift_step                     # (steps,)
    true_mean = torch.where(is_post, post.mean, before.mean).to(dt)
    true_var = torch.where(is_post, post.var, before.var).to(dt)
    x = z * true_var.sqrt().view(-1, 1, 1) + true_mean.view(-1, 1, 1)     # (steps, B, C)
    return x, z_held, true_mean, true_var


def simulation_batches(sim: RunningSimulation) -> torch.Tensor:
    """The training batches of ``sim``, shape ``(steps, batch_size, channels)``, float64.

    Regenerated from the run's seed and arguments (the simulation does not keep them), so
    that its buffers can be checked against any other implementation fed the same batches.
    """
    if not isinstance(sim, RunningSimulation):
        raise TypeError(f"simulation_batches: expected a RunningSimulation, got {type(sim).__name__}")
    return _draw(sim.batch_size, sim.shift, sim.seed, sim.steps, sim.shift_step, sim.channels,
                 sim.heldout, sim.before, sim.after)[0]


def simulate_running_stats(momentum: float | None = 0.1, batch_size: int = 8, shift: bool = True,
                           *, seed: int = 0, steps: int = STEPS, shift_step: int = SHIFT_STEP,
                           channels: int = 64, heldout: int = 128, eps: float = 1e-5,
                           before: Population = BEFORE, after: Population = AFTER
                           ) -> RunningSimulation:
    """Train a BatchNorm's running statistics on a known distribution; record everything.

    Batches ``1 .. shift_step`` come from ``before``; with ``shift=True`` the batches after
    ``shift_step`` come from ``after`` (without, every batch comes from ``before``).  See the
    module docstring for what is recorded.  ``heldout`` held-out samples per population are
    cut into ``heldout // batch_size`` batches for the train-mode outputs, so ``batch_size``
    must divide it.  Deterministic: the same arguments give the same tensors.
    """
    stats.check_momentum(momentum)
    _check_int(batch_size, "batch_size", 2)  # a batch of one cannot be normalized in training
    _check_int(steps, "steps", 1)
    _check_int(shift_step, "shift_step", 0)
    _check_int(channels, "channels", 1)
    _check_int(heldout, "heldout", 2)
    _check_int(seed, "seed", 0)
    if shift_step > steps:
        raise ValueError(f"simulate_running_stats: shift_step={shift_step} is after the last "
                         f"step ({steps})")
    if heldout % batch_size:
        raise ValueError(f"simulate_running_stats: batch_size={batch_size} must divide "
                         f"heldout={heldout} (the held-out set is cut into whole batches)")
    if not isinstance(shift, bool):
        raise TypeError(f"simulate_running_stats: shift must be True or False, got {shift!r}")
    if not isinstance(before, Population) or not isinstance(after, Population):
        raise TypeError("simulate_running_stats: before and after must be Population objects")

    dt = torch.float64
    x, z_held, true_mean, true_var = _draw(batch_size, shift, seed, steps, shift_step, channels,
                                           heldout, before, after)
    post = after if shift else before
    is_post = torch.arange(1, steps + 1) > shift_step                     # (steps,)

    bn = BatchNorm1d(channels, eps=eps, momentum=momentum, affine=False, dtype=dt)
    init_mean, init_var = float(bn.running_mean[0]), float(bn.running_var[0])
    biased_buffer = torch.full((channels,), init_var, dtype=dt)

    # held-out data and its train-mode outputs (these depend on the data only, not on the
    # buffers): one per population
    held, train_out, ideal = {}, {}, {}
    for pop in {before, post}:
        xh = z_held * pop.std + pop.mean
        held[pop] = xh
        train_out[pop] = torch.cat([F.batch_norm(chunk, None, None, training=True, eps=eps)
                                    for chunk in xh.split(batch_size)])
        ideal[pop] = (xh - pop.mean) / math.sqrt(pop.var + eps)

    # the batches' own statistics, all steps at once
    batch_var, batch_mean = torch.var_mean(x, dim=1, correction=0)       # (steps, C)
    batch_var_unbiased = stats.unbiased_from_biased(batch_var, batch_size)
    running_mean = torch.empty(steps, channels, dtype=dt)
    running_var = torch.empty(steps, channels, dtype=dt)
    running_var_biased = torch.empty(steps, channels, dtype=dt)
    nbt = torch.empty(steps, dtype=torch.int64)
    gap_te = torch.empty(steps, dtype=dt)
    gap_ei = torch.empty(steps, dtype=dt)
    with torch.no_grad():
        for i in range(steps):
            bn.train()
            bn(x[i])                                    # the module updates its buffers
            running_mean[i] = bn.running_mean
            running_var[i] = bn.running_var
            nbt[i] = bn.num_batches_tracked
            # the same update, fed the biased variance (a d2l / labml style buffer)
            factor = stats.averaging_factor(momentum, i + 1)
            running_var_biased[i] = stats.ema_update_(biased_buffer, batch_var[i], factor)
            # eval mode on held-out data from the current population, with these buffers
            pop = post if is_post[i] else before
            bn.eval()
            y_eval = bn(held[pop])
            gap_te[i] = torch.linalg.vector_norm(train_out[pop] - y_eval)
            gap_ei[i] = torch.linalg.vector_norm(y_eval - ideal[pop])
    bn.train()
    scale = 1.0 / math.sqrt(heldout * channels)         # root *mean* square over the values
    gap_te *= scale
    gap_ei *= scale
    out = dict(batch_mean=batch_mean, batch_var=batch_var, batch_var_unbiased=batch_var_unbiased,
               running_mean=running_mean, running_var=running_var,
               running_var_biased=running_var_biased)
    return RunningSimulation(
        momentum=momentum, batch_size=batch_size, shift=shift, seed=seed, steps=steps,
        shift_step=shift_step, channels=channels, heldout=heldout, eps=eps, before=before,
        after=after, initial_mean=init_mean, initial_var=init_var, true_mean=true_mean,
        true_var=true_var, num_batches_tracked=nbt, gap_train_eval=gap_te, gap_eval_ideal=gap_ei,
        **out)


def running_stats_grid(momenta: Iterable = MOMENTA, batch_sizes: Iterable[int] = BATCH_SIZES,
                       shifts: Iterable[bool] = (False, True), *, seed: int = 0, **kwargs
                       ) -> dict[tuple, RunningSimulation]:
    """:func:`simulate_running_stats` over a grid: ``{(momentum, batch_size, shift): run}``."""
    return {(m, b, s): simulate_running_stats(m, b, s, seed=seed, **kwargs)
            for m in momenta for b in batch_sizes for s in shifts}


# ---------------------------------------------------------------------------------------
# what theory predicts, to hold the simulation against
# ---------------------------------------------------------------------------------------
def ema_std(momentum: float, stat_var: float, t: int | None = None) -> float:
    r"""Standard deviation of an EMA of i.i.d. values of variance ``stat_var``.

    :math:`r_t = (1-m)^t r_0 + \sum_{j=0}^{t-1} m (1-m)^j s_{t-j}`, so
    :math:`\operatorname{Var} r_t = m^2 \sum_{j<t} (1-m)^{2j}\, \operatorname{Var} s
    = \frac{m}{2-m}\,\bigl(1 - (1-m)^{2t}\bigr)\operatorname{Var} s`
    (``t=None``: the stationary limit :math:`t\to\infty`).
    """
    stats.check_momentum(momentum)
    if momentum is None:
        raise ValueError("ema_std: momentum=None is the cumulative average, whose std is "
                         "sqrt(stat_var / t); this formula is for the EMA")
    m = float(momentum)
    tail = 1.0 if t is None else 1.0 - (1.0 - m) ** (2 * t)
    return math.sqrt(m / (2.0 - m) * tail * stat_var)


def recovery_steps(momentum: float, fraction: float = 0.1) -> int:
    r"""Steps after a jump until the EMA's *expected* remaining error is below ``fraction``.

    After :math:`k` steps of the new distribution, :math:`E[r] - \mu_{\text{new}} =
    (1-m)^k\,(E[r_0] - \mu_{\text{new}})`, so :math:`k = \lceil \ln f / \ln(1-m) \rceil`.
    """
    stats.check_momentum(momentum)
    if momentum is None or not 0.0 < float(momentum) < 1.0:
        raise ValueError(f"recovery_steps: needs 0 < momentum < 1, got {momentum!r}")
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"recovery_steps: fraction must be in (0, 1), got {fraction!r}")
    return math.ceil(math.log(fraction) / math.log(1.0 - float(momentum)))


def first_step_within(series: torch.Tensor, target: float, tol: float, start: int) -> int | None:
    """The first step ``t > start`` from which ``|series - target| <= tol`` holds to the end.

    ``series`` is indexed like a :class:`RunningSimulation` tensor (row ``t - 1`` is step
    ``t``).  Returns ``None`` if it never settles within ``tol``.
    """
    ok = (series[start:] - target).abs() <= tol
    if not bool(ok[-1]):
        return None
    bad = (~ok).nonzero()
    return start + 1 if bad.numel() == 0 else start + int(bad[-1]) + 2
