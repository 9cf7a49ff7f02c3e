"""normcore.distributed: SyncBatchNorm over gloo on CPU, the run helper, Chan's merge.

Every multi-process check runs in a real process group of 2 or 3 ranks on 127.0.0.1
(``normcore.distributed.run``) and is compared, in float64 and to ~1e-12, with one
BatchNorm (normcore's and torch's) that sees the whole batch in one process.
"""
from __future__ import annotations

import copy
import inspect
import multiprocessing
import time

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

import normcore.distributed as D
import normcore.nn as nn
from normcore import stats, sync
from normcore.distributed import SyncBatchNorm, compare, run
from normcore.launch import _bootstrap
import itertools

TIGHT = dict(rtol=1e-10, atol=1e-12)
METHODS = ("sync", "full", "torch")


@pytest.fixture(autouse=True)
def _no_leftovers():
    yield
    assert multiprocessing.active_children() == [], "run() left child processes behind"
    assert not dist.is_initialized(), "a test left a process group in the test process"


def check_sync_equals_full(res, steps, tol=TIGHT):
    """Outputs, gradients and buffers of SyncBatchNorm == full-batch normcore == torch."""
    full, world = res["full"], len(res["ranks"])
    for s in range(steps):
        for name in ("sync", "torch"):
            got = res[name]
            for k in ("output", "grad_input", "grad_weight", "grad_bias"):
                if full[k][s] is None:
                    assert got[k][s] is None, (name, k)
                    continue
                assert_close(got[k][s], full[k][s], **tol,
                             msg=lambda m: f"{name} {k} step {s}: {m}")
            for k in ("running_mean", "running_var", "num_batches_tracked"):
                if full[k][s] is None:
                    continue
                # (world, C) stacks: every rank's buffers equal the full-batch ones
                assert got[k][s].shape[0] == world
                assert_close(got[k][s], full[k][s], **tol,
                             msg=lambda m: f"{name} {k} step {s}: {m}")
    if full["running_mean"][0] is not None:  # eval mode: the (identical) buffers
        assert_close(res["sync"]["eval_output"], full["eval_output"], **tol)


# ---------------------------------------------------------------------------------------
# forward, backward and buffers == full-batch BN
# ---------------------------------------------------------------------------------------
CASES = {
    # id: (local batch sizes, spatial, momentum, extra kwargs)
    "2ranks-equal-NC": ([4, 4], (), 0.1, {}),
    "2ranks-unequal-NCL-cumulative": ([5, 2], (3,), None, {}),
    "3ranks-unequal-NCHW": ([3, 1, 4], (2, 3), 0.1, {}),
    "3ranks-rank-of-one-NC-cumulative": ([1, 6, 2], (), None, {}),
    "2ranks-NCDHW-no-bias": ([2, 3], (2, 2, 2), 0.3, {"bias": False}),
    "3ranks-no-affine-NCL": ([2, 2, 3], (2,), 0.1, {"affine": False}),
    "2ranks-no-running-stats": ([3, 4], (2,), 0.1, {"track_running_stats": False}),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_sync_equals_full_batch(case):
    sizes, spatial, momentum, extra = CASES[case]
    steps = 3
    res = compare(sizes, seed=len(case), spatial=spatial, momentum=momentum, steps=steps,
                  num_features=3, rank_shift=0.5, **extra)
    check_sync_equals_full(res, steps)
    sync = res["sync"]
    N = sum(sizes)
    assert sync["output"][0].shape == (N, 3) + tuple(spatial)
    if extra.get("track_running_stats", True):
        assert sync["num_batches_tracked"][-1].tolist() == [steps] * len(sizes)
    else:  # no buffers: eval mode uses each rank's own batch statistics, like torch
        assert sync["running_mean"][-1] is None
        assert_close(sync["eval_output"], res["per_device"]["eval_output"], **TIGHT)


def test_empty_local_batch():
    """A rank with no samples joins both collectives, returns an empty output and zero
    parameter gradients; the others get exactly the full-batch result."""
    res = compare([3, 0, 2], seed=5, spatial=(4,), momentum=0.1, steps=2, num_features=2)
    check_sync_equals_full(res, 2)
    empty = res["ranks"][1]["sync"]
    assert empty["output"][0].shape == (0, 2, 4)
    assert empty["grad_input"][0].shape == (0, 2, 4)
    assert_close(empty["grad_weight"][0], torch.zeros(2, dtype=torch.float64))
    assert_close(empty["grad_bias"][0], torch.zeros(2, dtype=torch.float64))
    assert res["ranks"][1]["per_device"]["output"][0] is None  # plain BN cannot train on nothing


def test_global_batch_of_one_value_raises_on_every_rank():
    # raised, not timed out: a rank left waiting in a collective would end in run's
    # TimeoutError (after the generous timeout, a guard against a hang), not this ValueError
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        compare([1, 0], seed=0, steps=1, timeout=120)


def test_float32():
    res = compare([3, 5], seed=2, spatial=(2, 2), dtype=torch.float32, steps=2)
    check_sync_equals_full(res, 2, tol=dict(rtol=1e-5, atol=1e-5))
    assert res["sync"]["output"][0].dtype == torch.float32


def test_per_device_bn_differs_from_full_batch():
    """Why sync is needed: per-device BN normalizes each slice with its own statistics."""
    res = compare([4, 4], seed=3, spatial=(3,), steps=2, rank_shift=2.0)
    per, full = res["per_device"], res["full"]
    assert (per["output"][0] - full["output"][0]).abs().max() > 0.1
    assert (per["grad_input"][0] - full["grad_input"][0]).abs().max() > 0.01
    rm = per["running_mean"][-1]  # (world, C): the ranks' buffers disagree
    assert (rm[0] - rm[1]).abs().max() > 0.1
    assert (per["running_mean"][-1][0] - full["running_mean"][-1][0]).abs().max() > 0.05
    check_sync_equals_full(res, 2)  # ... while sync BN matches on the same data
    # with a rank of one sample, per-device BN cannot even train; sync BN can
    res = compare([1, 5], seed=3, steps=1)
    assert res["ranks"][0]["per_device"]["output"][0] is None
    check_sync_equals_full(res, 1)


def test_a_wrong_merge_is_caught(monkeypatch):
    """The checks have teeth: average the ranks' means and variances instead of Chan's
    merge (forgetting the counts and the spread between ranks) and SyncBatchNorm no longer
    matches full-batch BN.  (The children are forked, so they inherit the patch.)"""

    def naive_merge(parts):
        parts = [p for p in parts if p.count > 0]
        n = sum(p.count for p in parts)
        mean = sum(p.mean for p in parts) / len(parts)
        var = sum(p.m2 / p.count for p in parts) / len(parts)
        return stats.Moments(n, mean, var * n)

    monkeypatch.setattr(sync, "merge", naive_merge)
    res = compare([5, 2], seed=4, steps=1, rank_shift=1.0, start_method="fork")
    with pytest.raises(AssertionError):
        check_sync_equals_full(res, 1)


def test_spawn_start_method():
    """Children that import normcore.distributed afresh (spawn, as on macOS/Windows)."""
    res = compare([2, 3], seed=6, spatial=(2,), steps=2, start_method="spawn", timeout=120)
    check_sync_equals_full(res, 2)


# ---------------------------------------------------------------------------------------
# Chan's merge
# ---------------------------------------------------------------------------------------
def test_chan_merge_of_slices_equals_two_pass():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(11, 3, 5, generator=gen, dtype=torch.float64) * 0.01 + 1e6  # |mu| >> sigma
    bounds = [0, 1, 1, 7, 11]  # unequal slices, one empty
    parts = [D.local_moments(x[a:b]) for a, b in itertools.pairwise(bounds)]
    assert [p.count for p in parts] == [5, 0, 30, 20]
    merged = stats.chan_merge_many(parts)
    var, mean = torch.var_mean(x, dim=(0, 2), correction=0)
    assert merged.count == 55
    assert_close(merged.mean, mean, rtol=1e-14, atol=0)
    assert_close(merged.var(), var, rtol=1e-7, atol=0)
    # averaging the slices' variances forgets the spread between slice means
    naive = sum(p.m2 / p.count for p in parts if p.count) / 3
    assert not torch.allclose(naive, var, rtol=1e-2)


def test_gathered_moments_in_a_world():
    res = compare([3, 1, 4], seed=7, spatial=(2,), steps=1)
    for r, rank in enumerate(res["ranks"]):
        m = rank["moments"]
        assert [g[0] for g in m["gathered"]] == [6, 2, 8]  # n_r = N_r * L
        assert m["gathered"][r][0] == m["local"][0]
        assert_close(m["gathered"][r][1], m["local"][1], rtol=0, atol=0)
        assert m["merged"][0] == m["two_pass"][0] == 16
        assert_close(m["merged"][1], m["two_pass"][1], **TIGHT)
        assert_close(m["merged"][2], m["two_pass"][2], **TIGHT)


# ---------------------------------------------------------------------------------------
# the module outside a world, eval mode, world of one, convert_sync_batchnorm
# ---------------------------------------------------------------------------------------
def test_signature_matches_torch():
    ours = inspect.signature(SyncBatchNorm.__init__).parameters
    theirs = inspect.signature(torch.nn.SyncBatchNorm.__init__).parameters
    assert [(p.name, p.default, p.kind) for p in ours.values()] == \
        [(p.name, p.default, p.kind) for p in theirs.values()]
    assert nn.SyncBatchNorm is SyncBatchNorm
    assert issubclass(SyncBatchNorm, nn._BatchNorm)


def test_state_dict_round_trip_with_torch():
    ours, theirs = SyncBatchNorm(4), torch.nn.SyncBatchNorm(4)
    with torch.no_grad():
        theirs.weight.uniform_()
        theirs.running_var.uniform_(1, 2)
        theirs.num_batches_tracked.fill_(7)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    assert int(ours.num_batches_tracked) == 7
    back = torch.nn.SyncBatchNorm(4)
    back.load_state_dict(ours.state_dict())
    assert_close(back.running_var, theirs.running_var)
    for bias in (True, False):
        assert [n for n, _ in SyncBatchNorm(3, bias=bias).named_parameters()] == \
            [n for n, _ in torch.nn.SyncBatchNorm(3, bias=bias).named_parameters()]


def test_bad_inputs():
    m = SyncBatchNorm(3).eval()
    with pytest.raises(ValueError, match="at least 2D"):
        m(torch.randn(3))
    with pytest.raises(ValueError, match="channels"):
        m(torch.randn(2, 4))
    with pytest.raises(TypeError, match="floating-point"):
        m(torch.ones(2, 3, dtype=torch.long))


def test_training_without_a_process_group_raises():
    assert not dist.is_initialized()
    m = SyncBatchNorm(3)
    x = torch.randn(4, 3, 2)
    with pytest.raises(RuntimeError, match="init_process_group") as info:
        m(x)
    assert "normcore.nn.BatchNorm" in str(info.value)
    assert int(m.num_batches_tracked) == 0  # the failed call did not count a batch
    with pytest.raises(RuntimeError, match="init_process_group"):
        D.sync_batch_norm(x)
    # eval mode needs no group: it is BatchNorm with the buffers
    with torch.no_grad():
        m.running_mean.fill_(0.5)
        m.running_var.fill_(4.0)
    ref = nn.BatchNorm1d(3)
    ref.load_state_dict(m.state_dict())
    assert_close(m.eval()(x), ref.eval()(x))


def _eval_on_rank0_only():
    """Only rank 0 calls forward, in eval mode: if eval communicated, this would hang."""
    m = SyncBatchNorm(3, dtype=torch.float64)
    with torch.no_grad():
        m.running_mean.copy_(torch.tensor([1.0, -1.0, 0.5]))
        m.running_var.copy_(torch.tensor([4.0, 0.25, 1.0]))
    m.eval()
    x = torch.arange(12, dtype=torch.float64).reshape(2, 3, 2)
    if dist.get_rank() != 0:
        return None
    with torch.no_grad():
        ys = [m(x) for _ in range(3)]
    want = (x - m.running_mean.view(1, 3, 1)) / torch.sqrt(m.running_var.view(1, 3, 1) + m.eps)
    return [float((y - want).abs().max()) for y in ys]


def test_eval_mode_does_not_communicate():
    errs, none = run(_eval_on_rank0_only, 2, timeout=20)
    assert none is None and max(errs) < 1e-14


def _world_of_one(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 3, 4, generator=gen, dtype=torch.float64)
    kw = dict(momentum=None, dtype=torch.float64)
    sync, plain = SyncBatchNorm(3, **kw), nn.BatchNorm1d(3, **kw)
    out = []
    for m in (sync, plain):
        xi = x.clone().requires_grad_(True)
        m(xi).pow(3).sum().backward()
        m(x * 2)
        out.append((m(x).detach(), xi.grad, m.weight.grad, m.running_var.clone(),
                    int(m.num_batches_tracked)))
    return out


def test_world_of_one_is_plain_batch_norm():
    (sync, plain), = run(_world_of_one, 1, 0)
    for a, b in zip(sync, plain):
        assert_close(a, b, **TIGHT)


def test_convert_sync_batchnorm():
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 6),
        torch.nn.BatchNorm1d(6, momentum=None),
        torch.nn.ReLU(),
        torch.nn.Sequential(nn.BatchNorm1d(6, eps=1e-3, affine=False), torch.nn.InstanceNorm1d(6)),
        torch.nn.BatchNorm2d(6, bias=False, track_running_stats=False),
    ).double()
    model[1].weight.requires_grad_(False)
    model[3][0].eval()
    with torch.no_grad():
        model[1].running_mean.fill_(3.0)
    before = list(model.state_dict())
    running_mean = model[1].running_mean
    params_before = dict(model.named_parameters())
    group = object()  # stands for a process group; it is only stored
    out = SyncBatchNorm.convert_sync_batchnorm(model, process_group=group)
    assert out is model
    bn1, bn2, bn3 = out[1], out[3][0], out[4]
    for m in (bn1, bn2, bn3):
        assert type(m) is SyncBatchNorm and m.process_group is group
    assert isinstance(out[0], torch.nn.Linear) and isinstance(out[3][1], torch.nn.InstanceNorm1d)
    assert bn1.momentum is None and bn2.eps == 1e-3 and not bn2.affine
    assert bn3.bias is None and bn3.weight is not None and not bn3.track_running_stats
    assert bn1.training and not bn2.training
    assert not bn1.weight.requires_grad and bn1.bias.requires_grad
    assert bn1.weight.dtype == torch.float64
    # the same tensors: an optimizer built before the conversion still works
    assert dict(out.named_parameters()) == params_before
    assert bn1.running_mean is running_mean
    assert list(out.state_dict()) == before
    # a BatchNorm itself is replaced by a new module
    single = nn.BatchNorm2d(5)
    new = SyncBatchNorm.convert_sync_batchnorm(single)
    assert type(new) is SyncBatchNorm and new.weight is single.weight and new.process_group is None


def _small_model():
    """Two BatchNorms (one on (N, C, L) after a conv, one on (N, C) with the cumulative
    average), in float64: what DDP and the single process train side by side."""
    return torch.nn.Sequential(
        torch.nn.Conv1d(3, 4, 3), torch.nn.BatchNorm1d(4), torch.nn.Tanh(), torch.nn.Flatten(),
        torch.nn.Linear(16, 5), torch.nn.BatchNorm1d(5, momentum=None), torch.nn.Tanh(),
        torch.nn.Linear(5, 2)).double()


def _train_with_ddp(seed, local_batch_sizes, steps=3, lr=0.1):
    """torch's DistributedDataParallel around a torch model converted to normcore's
    SyncBatchNorm, each rank on its slice of the batch, against the unconverted model
    trained in this process on the whole batch.  Returns, per step, the largest differences
    of the outputs, input gradients, parameter gradients and buffers (this rank's part)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    full = _small_model()
    local = SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(full))
    ddp = torch.nn.parallel.DistributedDataParallel(local)   # CPU, gloo: no device_ids
    bounds = [0]
    for b in local_batch_sizes:
        bounds.append(bounds[-1] + b)
    N, (lo, hi) = bounds[-1], bounds[rank:rank + 2]
    gen = torch.Generator().manual_seed(seed + 1)
    out = []
    for _ in range(steps):
        x = torch.randn(N, 3, 6, generator=gen, dtype=torch.float64) * 2 + 1
        t = torch.randn(N, 2, generator=gen, dtype=torch.float64)
        xf, xl = x.clone().requires_grad_(True), x[lo:hi].clone().requires_grad_(True)
        full.zero_grad()
        ddp.zero_grad()
        yf = full(xf)
        # the whole batch's mean loss; a rank's loss is its part of that sum, times W, so that
        # DDP's mean of the ranks' gradients is the gradient of the whole batch's loss
        ((yf - t) ** 2).sum(1).mean().backward()
        yl = ddp(xl)
        (((yl - t[lo:hi]) ** 2).sum(1).sum() * world / N).backward()
        diff = {"output": (yl - yf[lo:hi]).detach().abs().max(),
                # SyncBatchNorm's backward sums over the ranks: the input gradient is that of
                # the sum of the ranks' losses, W times the whole batch's mean
                "grad_input": (xl.grad - world * xf.grad[lo:hi]).abs().max()}
        for (name, p), q in zip(full.named_parameters(), local.parameters()):
            diff[f"grad {name}"] = (p.grad - q.grad).abs().max()
        for (name, b), c in zip(full.named_buffers(), local.buffers()):
            diff[name] = (b.double() - c.double()).abs().max()
        out.append({k: float(v) for k, v in diff.items()})
        with torch.no_grad():   # plain SGD on both
            for p, q in zip(full.parameters(), local.parameters()):
                p -= lr * p.grad
                q -= lr * q.grad
    assert all(type(m) is not torch.nn.SyncBatchNorm for m in ddp.modules())
    syncs = [m for m in ddp.modules() if isinstance(m, SyncBatchNorm)]
    return {"diffs": out, "sync_layers": len(syncs), "rows": hi - lo}


@pytest.mark.parametrize("sizes", [[4, 4], [3, 1, 4]], ids=["2ranks-equal", "3ranks-unequal"])
def test_ddp_trains_normcore_sync_batchnorm_on_cpu_like_one_process(sizes):
    """DistributedDataParallel on CPU with gloo wraps a model of normcore's SyncBatchNorm
    (it refuses torch's there) and trains it: outputs, gradients and buffers equal those of
    one process on the concatenated batch, step after step (the parameters too, then)."""
    results = run(_train_with_ddp, len(sizes), 0, sizes, timeout=120)
    for rank, res in enumerate(results):
        assert res["sync_layers"] == 2 and res["rows"] == sizes[rank]
        assert len(res["diffs"]) == 3
        for step, diffs in enumerate(res["diffs"]):
            assert len(diffs) == 2 + 10 + 6, sorted(diffs)  # 10 parameters, 6 buffers
            for name, d in diffs.items():
                assert d < 1e-12, (rank, step, name, d)


# ---------------------------------------------------------------------------------------
# the run helper
# ---------------------------------------------------------------------------------------
def _whoami(tag, *, power=1):
    return (dist.get_rank(), dist.get_world_size(), dist.get_backend(), tag * power)


def test_run_returns_results_in_rank_order():
    assert run(_whoami, 3, "ab", power=2) == [(r, 3, "gloo", "abab") for r in range(3)]


def _raise_on_rank1():
    if dist.get_rank() == 1:
        raise KeyError("boom on rank 1")
    time.sleep(3600)  # rank 0 does not end by itself (nor by a collective's error): run stops it


def test_run_reraises_worker_exception_with_traceback():
    # the KeyError, not run's TimeoutError: run stopped rank 0 when rank 1 failed, instead of
    # waiting for the timeout (generous: it only guards against a hang)
    with pytest.raises(KeyError, match="boom on rank 1") as info:
        run(_raise_on_rank1, 2, timeout=120)
    cause = info.value.__cause__
    assert isinstance(cause, D.RemoteTraceback)
    assert "[rank 1]" in str(cause) and "_raise_on_rank1" in str(cause)


def _sleep_on_rank0(seconds):
    if dist.get_rank() == 0:
        time.sleep(seconds)
    return dist.get_rank()


def test_run_times_out_instead_of_hanging():
    # rank 0 sleeps for an hour: only run's timeout ends the call (pytest's own timeout
    # would fail the test if run hung)
    with pytest.raises(TimeoutError, match="did not finish within timeout=2"):
        run(_sleep_on_rank0, 2, 3600, timeout=2)


def _fails(msg):
    raise ValueError(msg)


def _ok():
    return dist.get_world_size()


def test_process_group_is_destroyed(tmp_path):
    """The worker's finally destroys the group, whether fn returns or raises (run in this
    process, as rank 0 of a world of one)."""
    threads = torch.get_num_threads()  # _bootstrap sets 1 thread per rank
    _bootstrap(0, 1, D.free_port(), _ok, (), {}, str(tmp_path), 30)
    assert not dist.is_initialized()
    envelope = torch.load(tmp_path / "rank0.pt", weights_only=False)
    assert envelope["ok"] and envelope["result"] == 1 and envelope["initialized"] is False
    with pytest.raises(SystemExit):
        _bootstrap(0, 1, D.free_port(), _fails, ("bad",), {}, str(tmp_path), 30)
    assert not dist.is_initialized()
    assert not torch.load(tmp_path / "rank0.pt", weights_only=False)["ok"]
    torch.set_num_threads(threads)
    # and run still works afterwards, returning cleanly
    assert run(_ok, 2) == [2, 2]


def test_run_argument_checks():
    with pytest.raises(ValueError, match="world_size"):
        run(_ok, 0)
    with pytest.raises(ValueError, match="timeout"):
        run(_ok, 2, timeout=0)
