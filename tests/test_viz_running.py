"""The running-statistics simulator (normcore.experiments) and its pictures
(normcore.viz.running): shapes, seeding, the shift in the data, parity of the buffers with
torch, the theory the chapter holds it against, the renderer, and bad arguments."""
from __future__ import annotations

import math

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
from matplotlib.figure import Figure

from normcore import experiments as E
from normcore import stats
from normcore.viz import running as R

PNG = b"\x89PNG\r\n\x1a\n"
SMALL = dict(steps=60, shift_step=30, channels=16, heldout=64)


@pytest.fixture(scope="module")
def sim():
    return E.simulate_running_stats(0.1, 8, True, **SMALL)


# --- the record -------------------------------------------------------------------------------


def test_shapes_dtypes_and_counts(sim):
    T, C = SMALL["steps"], SMALL["channels"]
    for name in ("batch_mean", "batch_var", "batch_var_unbiased", "running_mean", "running_var",
                 "running_var_biased"):
        t = getattr(sim, name)
        assert t.shape == (T, C) and t.dtype == torch.float64, name
    for name in ("true_mean", "true_var", "gap_train_eval", "gap_eval_ideal"):
        assert getattr(sim, name).shape == (T,), name
    assert torch.equal(sim.num_batches_tracked, torch.arange(1, T + 1))
    assert torch.equal(sim.step, torch.arange(1, T + 1))
    assert (sim.initial_mean, sim.initial_var) == (0.0, 1.0)   # torch's initial buffers
    assert (sim.gap_train_eval >= 0).all() and (sim.gap_eval_ideal >= 0).all()
    assert "momentum=0.1" in sim.label and "batch size 8" in sim.label and "shift" in sim.label


def test_seeded_and_common_random_numbers():
    a = E.simulate_running_stats(0.1, 8, True, seed=3, **SMALL)
    b = E.simulate_running_stats(0.1, 8, True, seed=3, **SMALL)
    c = E.simulate_running_stats(0.1, 8, True, seed=4, **SMALL)
    for name in ("batch_mean", "running_mean", "running_var", "gap_train_eval"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.equal(a.batch_mean, c.batch_mean)
    # runs that differ only in momentum see the same batches
    d = E.simulate_running_stats(0.5, 8, True, seed=3, **SMALL)
    assert torch.equal(a.batch_mean, d.batch_mean) and not torch.equal(a.running_mean, d.running_mean)
    # the shift does not change the batches before it
    e = E.simulate_running_stats(0.1, 8, False, seed=3, **SMALL)
    k = SMALL["shift_step"]
    assert torch.equal(a.batch_mean[:k], e.batch_mean[:k])
    assert torch.equal(a.running_mean[:k], e.running_mean[:k])


def test_the_shift_is_visible_in_the_data():
    s = E.simulate_running_stats(0.1, 64, True)
    k = E.SHIFT_STEP
    assert torch.all(s.true_mean[:k] == E.BEFORE.mean) and torch.all(s.true_mean[k:] == E.AFTER.mean)
    assert torch.all(s.true_var[:k] == E.BEFORE.var) and torch.all(s.true_var[k:] == E.AFTER.var)
    assert abs(s.batch_mean[:k].mean() - E.BEFORE.mean) < 0.02
    assert abs(s.batch_mean[k:].mean() - E.AFTER.mean) < 0.02
    assert abs(s.batch_var_unbiased[:k].mean() / E.BEFORE.var - 1) < 0.02
    assert abs(s.batch_var_unbiased[k:].mean() / E.AFTER.var - 1) < 0.02
    # the buffers follow it
    assert abs(s.running_mean[k - 1].mean() - E.BEFORE.mean) < 0.05
    assert abs(s.running_mean[-1].mean() - E.AFTER.mean) < 0.05
    # and without the shift nothing changes
    n = E.simulate_running_stats(0.1, 64, False)
    assert torch.all(n.true_mean == E.BEFORE.mean)
    assert abs(n.batch_mean[k:].mean() - E.BEFORE.mean) < 0.02


@pytest.mark.parametrize("momentum", [0.1, None])
def test_buffers_equal_torch_batchnorm_fed_the_same_batches(momentum):
    s = E.simulate_running_stats(momentum, 2, True, **SMALL)
    bn = torch.nn.BatchNorm1d(SMALL["channels"], momentum=momentum, affine=False, dtype=torch.float64)
    biased = torch.ones(SMALL["channels"], dtype=torch.float64)
    batches = E.simulation_batches(s)
    assert batches.shape == (SMALL["steps"], 2, SMALL["channels"])
    for t, x in enumerate(batches):
        bn(x)
        torch.testing.assert_close(bn.running_mean, s.running_mean[t], rtol=0, atol=1e-12)
        torch.testing.assert_close(bn.running_var, s.running_var[t], rtol=0, atol=1e-12)
        f = 1 / (t + 1) if momentum is None else momentum
        biased = (1 - f) * biased + f * x.var(0, correction=0)
        torch.testing.assert_close(biased, s.running_var_biased[t], rtol=0, atol=1e-12)
    torch.testing.assert_close(s.batch_var_unbiased, batches.var(1, correction=1))


def test_gaps_match_their_definition(sim):
    # recompute the last step's gaps from the definitions, with torch's BatchNorm
    held = torch.randn(SMALL["heldout"], SMALL["channels"],
                       generator=_held_generator(sim), dtype=torch.float64)
    xh = held * E.AFTER.std + E.AFTER.mean
    train = torch.cat([torch.nn.functional.batch_norm(c, None, None, training=True)
                       for c in xh.split(sim.batch_size)])
    evald = torch.nn.functional.batch_norm(xh, sim.running_mean[-1], sim.running_var[-1],
                                           training=False)
    ideal = (xh - E.AFTER.mean) / math.sqrt(E.AFTER.var + sim.eps)
    rms = lambda d: d.pow(2).mean().sqrt()
    torch.testing.assert_close(sim.gap_train_eval[-1], rms(train - evald))
    torch.testing.assert_close(sim.gap_eval_ideal[-1], rms(evald - ideal))


def _held_generator(sim):
    # the simulator draws the training batches first, then the held-out standard normals
    g = torch.Generator().manual_seed(sim.seed)
    torch.randn(sim.steps, sim.batch_size, sim.channels, generator=g, dtype=torch.float64)
    return g


def test_small_batches_have_a_larger_train_eval_gap():
    gaps = {B: E.simulate_running_stats(None, B, False, **SMALL).gap_train_eval[20:].mean()
            for B in (2, 8, 64)}
    assert gaps[2] > gaps[8] > gaps[64]


def test_grid_keys():
    g = E.running_stats_grid((0.1, None), (2,), (True,), **SMALL)
    assert list(g) == [(0.1, 2, True), (None, 2, True)]


# --- theory ----------------------------------------------------------------------------------


def test_ema_std_against_a_direct_sum():
    m, v, t = 0.1, 2.0, 7
    direct = math.sqrt(sum((m * (1 - m) ** j) ** 2 for j in range(t)) * v)
    assert math.isclose(E.ema_std(m, v, t), direct, rel_tol=1e-12)
    assert math.isclose(E.ema_std(m, v), math.sqrt(m / (2 - m) * v), rel_tol=1e-12)


def test_recovery_steps():
    assert E.recovery_steps(0.5) == 4 and E.recovery_steps(0.1) == 22 and E.recovery_steps(0.01) == 230
    r = torch.ones(1, dtype=torch.float64)
    k = E.recovery_steps(0.1, 0.05)
    for _ in range(k - 1):
        stats.ema_update_(r, torch.zeros(1, dtype=torch.float64), 0.1)
    assert r.item() >= 0.05
    stats.ema_update_(r, torch.zeros(1, dtype=torch.float64), 0.1)
    assert r.item() < 0.05


def test_first_step_within():
    s = torch.tensor([5.0, 5.0, 3.0, 0.5, 2.0, 0.2, 0.1, 0.0])
    assert E.first_step_within(s, 0.0, 0.6, start=2) == 6   # step 6 (index 5) on stays within
    assert E.first_step_within(s, 0.0, 0.01, start=2) == 8
    assert E.first_step_within(s, 10.0, 0.5, start=0) is None
    assert E.first_step_within(s, 0.0, 10.0, start=2) == 3


# --- bad arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(batch_size=1), ValueError, "batch_size"),
    (dict(batch_size=2.0), TypeError, "batch_size"),
    (dict(momentum=1.5), ValueError, "momentum"),
    (dict(momentum="0.1"), TypeError, "momentum"),
    (dict(steps=0), ValueError, "steps"),
    (dict(shift_step=500), ValueError, "shift_step"),
    (dict(heldout=100, batch_size=8), ValueError, "divide"),
    (dict(shift="yes"), TypeError, "shift"),
    (dict(before=(2.0, 4.0)), TypeError, "Population"),
    (dict(seed=-1), ValueError, "seed"),
])
def test_bad_arguments_raise(kwargs, exc, words):
    args = dict(momentum=0.1, batch_size=8, shift=True)
    args.update(kwargs)
    with pytest.raises(exc, match=words):
        E.simulate_running_stats(**args)


def test_bad_population_and_theory_arguments():
    with pytest.raises(ValueError, match="var > 0"):
        E.Population(0.0, 0.0)
    with pytest.raises(ValueError, match="cumulative"):
        E.ema_std(None, 1.0)
    with pytest.raises(ValueError, match="momentum"):
        E.recovery_steps(1.0)
    with pytest.raises(ValueError, match="fraction"):
        E.recovery_steps(0.1, 1.5)
    with pytest.raises(TypeError, match="RunningSimulation"):
        E.simulation_batches("not a run")


# --- the renderer ------------------------------------------------------------------------------


def test_simulation_figure(sim):
    fig = R.simulation_figure(sim)
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    mean_ax, var_ax, gap_ax = fig.axes
    # the axis limits depend on the populations only: the same for every frame of a grid
    other = R.simulation_figure(E.simulate_running_stats(0.5, 2, False, **SMALL))
    assert mean_ax.get_ylim() == other.axes[0].get_ylim() and var_ax.get_ylim() == other.axes[1].get_ylim()
    assert gap_ax.get_yscale() == "log"
    # the blue curve is channel 0's running_mean, starting at the initial value
    line = next(ln for ln in mean_ax.get_lines() if ln.get_color() == R.COLORS["running"])
    y = line.get_ydata()
    assert y[0] == sim.initial_mean and len(y) == sim.steps + 1
    assert torch.allclose(torch.as_tensor(y[1:]), sim.running_mean[:, 0])
    # the shift is marked only when there is one
    assert any(ln.get_linestyle() == ":" for ln in mean_ax.get_lines())
    assert not any(ln.get_linestyle() == ":" for ln in other.axes[0].get_lines())


def test_simulation_png_is_small_and_deterministic():
    noisy = E.simulate_running_stats(0.5, 2, False)   # the busiest frame of the chapter's grid
    a, b = R.simulation_png(noisy), R.simulation_png(noisy)
    assert a.startswith(PNG) and a == b
    assert len(a) < 40_000   # 24 frames * 40 kB * 4/3 (base64) stays within 1.3 MB
    assert R.simulation_png(E.simulate_running_stats(0.5, 2, True)) != a


def test_renderer_bad_arguments(sim):
    with pytest.raises(TypeError, match="RunningSimulation"):
        R.simulation_figure({"running_mean": 0})
    with pytest.raises(ValueError, match="channel"):
        R.simulation_figure(sim, channel=SMALL["channels"])
    with pytest.raises(ValueError, match="channel"):
        R.simulation_figure(sim, channel=True)
    with pytest.raises(ValueError, match="lags"):
        R.ema_weights_figure(lags=0)
    with pytest.raises(ValueError, match="None"):
        R.ema_weights_figure((0.1, None))
    with pytest.raises(ValueError, match="momentum"):
        R.ema_weights_figure((2.0,))


def test_ema_weights_figure_reads_the_weights_off_ema_update():
    fig = R.ema_weights_figure((0.1, 0.5), lags=10)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 2
    for ln, m in zip(lines, (0.1, 0.5)):
        w = ln.get_ydata()
        assert all(math.isclose(w[j], m * (1 - m) ** j, rel_tol=1e-12) for j in range(10))


def _smallest_text_px(fig, display_dpi: float) -> float:
    """The smallest font of any visible text in ``fig``, in px at ``display_dpi``."""
    fig.canvas.draw()
    sizes = [t.get_fontsize() for t in fig.findobj(matplotlib.text.Text)
             if t.get_visible() and t.get_text().strip()]
    return min(sizes) * display_dpi / 72


def test_simulator_frame_text_is_at_least_10px_as_displayed(sim):
    """The chapter shows the frames at 80 px per inch (static_widget's dpi; the PNG holds
    twice the pixels for HiDPI screens): every text is then at least 10 px."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = R.simulation_figure(sim)
    FigureCanvasAgg(fig)
    assert _smallest_text_px(fig, 80) >= 10
    assert "\u03b1" in R.title(sim) and "N = " in R.title(sim)   # the book's notation
