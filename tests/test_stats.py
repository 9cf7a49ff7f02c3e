"""normcore.stats: three variances, Chan's merge, running averages against torch."""
import pytest
import torch

from normcore import stats


def _data(n=1000, loc=0.0, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 3, generator=g, dtype=torch.float64) * 2 + loc).to(dtype)


@pytest.mark.parametrize("correction", [0, 1])
def test_three_variances_agree_on_easy_data(correction):
    x = _data()
    ref = x.var(0, correction=correction)
    for v in (stats.var_naive(x, 0, correction), stats.var_two_pass(x, 0, correction),
              stats.var_welford(x, 0, correction)):
        torch.testing.assert_close(v, ref)


def test_naive_variance_loses_precision_with_a_large_mean():
    x = _data(loc=1e4, dtype=torch.float32)   # std 2, mean 10^4
    exact = x.double().var(0, unbiased=False)
    rel = lambda v: ((v.double() - exact).abs() / exact).max().item()
    # two-pass and Welford keep ~3-4 digits in float32; naive keeps fewer than 2
    assert rel(stats.var_two_pass(x, 0)) < 1e-3
    assert rel(stats.var_welford(x, 0)) < 1e-3
    assert rel(stats.var_naive(x, 0)) > 1e-2


def test_chan_merge_equals_whole():
    x = _data(n=37)
    parts = [stats.moments(p, 0) for p in torch.split(x, [5, 1, 20, 11])]
    whole = stats.moments(x, 0)
    for merged in (stats.chan_merge_many(parts),
                   stats.chan_merge(stats.chan_merge(parts[0], parts[1]),
                                    stats.chan_merge(parts[2], parts[3]))):
        assert merged.count == 37
        torch.testing.assert_close(merged.mean, whole.mean)
        torch.testing.assert_close(merged.m2, whole.m2)
        torch.testing.assert_close(merged.var(1), x.var(0, unbiased=True))
    w = stats.welford(x, 0)
    torch.testing.assert_close(w.m2, whole.m2)


@pytest.mark.parametrize("momentum", [0.1, 0.9, None])
def test_running_stats_match_torch_batchnorm(momentum):
    ours = stats.RunningStats(3, momentum=momentum)
    bn = torch.nn.BatchNorm1d(3, momentum=momentum)
    for s in range(6):
        b = _data(n=4 + s, loc=s, seed=s, dtype=torch.float32)
        ours.update(b)
        bn(b)
    torch.testing.assert_close(ours.mean, bn.running_mean)
    torch.testing.assert_close(ours.var, bn.running_var)
    assert ours.num_batches_tracked == int(bn.num_batches_tracked)


def test_ema_direction():
    r = torch.tensor([10.0])
    stats.ema_update_(r, torch.tensor([0.0]), 0.1)
    assert r.item() == pytest.approx(9.0)  # momentum weighs the NEW value
    assert stats.averaging_factor(None, 4) == 0.25
