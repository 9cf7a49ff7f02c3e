"""normcore.loops and normcore.positions: the compiled kernels are the Python loops they are
written as, take LayerNorm, RMSNorm, GroupNorm, InstanceNorm and channels_last BatchNorm when
numba is there and only then, give results that do not depend on the number of threads,
take a second pass where the first cancels, and keep their column sums small on long rows.
(Against the formula, the boxed backward and torch: tests/test_speed_paths.py and
tests/test_frozen.py, with the `loops_or_blocks` fixture; their accuracy against torch's:
tests/test_accuracy.py.)"""
from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as TF

import normcore.functional as F
from normcore import axes, core, loops, positions, rows


def _case(rows_, n, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows_, n, generator=gen, dtype=dtype) * 3 + 1.5
    w = torch.rand(n, generator=gen, dtype=dtype) + 0.5
    b = torch.randn(n, generator=gen, dtype=dtype)
    g = torch.randn(rows_, n, generator=gen, dtype=dtype)
    return x, w, b, g


@pytest.mark.parametrize("centered", [True, False])
def test_the_compiled_kernels_are_the_python_loops(centered):
    """The same functions run uncompiled (plain Python on numpy arrays) and compiled: the same
    outputs to float64 roundings (the compiled sums are reassociated to vectorize)."""
    assert loops.available()
    x, w, b, g = _case(7, 5)
    chunk, chunks = 3, 3
    outs = []
    for kernel in (lambda f: f, loops._kernel):
        y = torch.empty_like(x)
        stats = torch.empty(3, 7, dtype=torch.float64)
        kernel(loops.forward_rows)(x.numpy(), w.numpy(), b.numpy(), 1e-5, centered, y.numpy(),
                                   stats.numpy(), chunk, 0, chunks)
        dx = torch.empty_like(x)
        parts = torch.zeros(2, chunks, 5, dtype=torch.float64)
        kernel(loops.backward_rows)(x.numpy(), g.numpy(), w.numpy(), stats[0].numpy(),
                                    stats[2].numpy(), centered, dx.numpy(), parts.numpy(),
                                    chunk, 0, chunks)
        outs.append((y, stats, dx, parts))
    for a, c in zip(*outs):
        torch.testing.assert_close(a, c, rtol=1e-13, atol=1e-13)
    # and they are LayerNorm (RMSNorm): torch's, in float64
    y, stats, dx, parts = outs[1]
    xr, wr, br = (t.clone().requires_grad_(True) for t in (x, w, b))
    if centered:
        yr = TF.layer_norm(xr, (5,), wr, br, 1e-5)
    else:
        yr = TF.rms_norm(xr, (5,), wr, 1e-5) + br
    torch.testing.assert_close(y, yr)
    ref = torch.autograd.grad(yr, (xr, wr, br), g)
    torch.testing.assert_close(dx, ref[0])
    torch.testing.assert_close(parts.sum(1), torch.stack(ref[1:]))


def test_large_layer_norms_take_the_loops_and_only_with_numba(monkeypatch):
    x, w, b, _ = _case(2048, 512, torch.float32)
    lay = axes.layout("layer", x.shape, normalized_ndim=1)
    assert rows.applies(lay, x)
    calls = []
    real = loops.forward
    monkeypatch.setattr(loops, "forward", lambda *a: calls.append(1) or real(*a))
    F.layer_norm(x, (512,), w, b)
    assert calls == [1]
    F.layer_norm(x.half(), (512,), w.half(), b.half())               # half: the blocks
    F.layer_norm(x[:, :256], (256,), w[:256], b[:256])               # not contiguous: plain
    assert calls == [1]
    monkeypatch.setenv("NORMCORE_NUMBA", "0")
    F.layer_norm(x, (512,), w, b)
    assert calls == [1]


def test_without_numba_the_blocks_run(monkeypatch):
    """numba not installed (an import that fails): available() is False, and the blocks give
    the same LayerNorm to float32 roundings."""
    x, w, b, g = _case(2048, 512, torch.float32, seed=1)
    want = F.layer_norm(x, (512,), w, b)
    monkeypatch.setattr(loops, "_compiled", {})
    monkeypatch.setitem(sys.modules, "numba", None)           # `import numba` raises
    assert not loops.available()
    torch.testing.assert_close(F.layer_norm(x, (512,), w, b), want)
    assert loops.np is not None      # numpy stays for the kernels compiled after (it was lost)


CL = torch.channels_last
THREAD_CASES = {
    "layer": ((2048, 512), lambda x, w, b: F.layer_norm(x, (512,), w, b)),
    "rms": ((2048, 512), lambda x, w, b: F.rms_norm(x, (512,), w) + b),
    "group": ((8, 16, 96, 96), lambda x, w, b: F.group_norm(x, 4, w, b)),
    "group channels_last": ((8, 16, 96, 96), lambda x, w, b: F.group_norm(x.to(memory_format=CL), 4, w, b)),
    "batch channels_last": ((8, 16, 96, 96), lambda x, w, b: F.batch_norm(
        x.to(memory_format=CL), None, None, w, b, training=True)),
}


@pytest.mark.parametrize("case", sorted(THREAD_CASES))
def test_the_results_do_not_depend_on_the_thread_count(monkeypatch, case):
    """Every output bit for bit the same on 1, 2 and 3 threads: rows (sets, samples,
    positions) split among threads by whole chunks, and the chunks' sums added in one order."""
    monkeypatch.setattr(loops, "CHUNK_ELEMENTS", 4096)     # rows: 64 chunks of 8 rows
    shape, op = THREAD_CASES[case]
    gen = torch.Generator().manual_seed(2)                   # float64: no rounding hides it
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 3 + 1.5
    w = torch.rand(shape[-1] if len(shape) == 2 else shape[1], generator=gen,
                   dtype=torch.float64) + 0.5
    b = torch.randn(w.shape, generator=gen, dtype=torch.float64)
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    calls = []
    for module, name in ((loops, "forward"), (loops, "forward_by_sets"),
                         (positions, "forward_positions")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=real, _n=name: calls.append(_n) or _f(*a))
    before = torch.get_num_threads()
    got = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
            y = op(*leaves)
            got.append((y, *torch.autograd.grad(y, leaves, g)))
    finally:
        torch.set_num_threads(before)
    assert len(calls) == 3, calls                             # the compiled kernels ran
    for other in got[1:]:
        for a, c in zip(got[0], other):
            assert torch.equal(a, c)


SECOND_PASS = {   # (norm, shape, G, memory format): 65536 values per set (BN: per channel)
    "batch channels_last": ("batch", (1, 4, 128, 128), None, CL),
    "group channels_last": ("group", (2, 4, 128, 128), 1, CL),
    "group": ("group", (2, 4, 128, 128), 1, torch.contiguous_format),
    "layer": ("layer", (3, 65536), None, torch.contiguous_format),
}


@pytest.mark.parametrize("case", sorted(SECOND_PASS))
def test_a_second_pass_where_the_first_cancels(monkeypatch, case):
    """The first pass sums about each set's (channel's) first value, which bounds the
    cancellation by the number of values: with 65536 of them and that value an outlier, the
    float64 output was 2e-11 to 9e-11 off; summed again about the mean, within 5e-15 of the
    formula's, here 1e-13 (BN: the Python side's check, one sample of every position; GN on
    channels_last: the per-sample kernel's; GN and LN: the kernels' over each set and row;
    through Normalize: float64 GN without a gradient keeps the formula's path)."""
    norm, shape, G, fmt = SECOND_PASS[case]
    monkeypatch.setattr(rows, "MIN_ELEMENTS", 64)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    x[(slice(None),) + (0,) * (len(shape) - 1)] = 1e6     # each set's first value
    xc = x.contiguous(memory_format=fmt)
    lay = axes.layout(norm, shape, G, 1 if norm == "layer" else None)
    assert rows.applies(lay, xc)
    op = {"batch": lambda t: F.batch_norm(t, None, None, training=True),
          "group": lambda t: F.group_norm(t, 1),
          "layer": lambda t: F.layer_norm(t, shape[-1:])}[norm]
    ref = core.normalize_formula(x, lay, 1e-5).output
    err = ((op(xc.requires_grad_(True)) - ref).abs().max() / ref.abs().max()).item()
    assert err <= 1e-13, err


def test_long_rows_take_few_chunks():
    """The backward keeps two float64 rows of column sums per chunk: a LayerNorm over (C, H, W)
    (32 rows of 65536) takes 4 chunks, not 32 (33 MB of sums); short rows take 256 KB."""
    for rows_, n in [(32, 65536), (8192, 512), (3, 7), (100000, 3)]:
        chunk, chunks = loops._chunks(rows_, n)
        assert chunks == -(-rows_ // chunk)                    # every row in one chunk
        assert 16 * chunks * n <= max(loops.PARTS_BYTES, 16 * n), (rows_, n, chunks)
        assert chunks == 1 or chunk * n <= loops.CHUNK_ELEMENTS or 16 * chunks * n > loops.PARTS_BYTES // 2
    assert loops._chunks(32, 65536) == (8, 4)
    assert loops._chunks(8192, 512) == (128, 64)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork on this platform")
def test_a_forked_child_runs_the_threaded_kernels(monkeypatch):
    """After the pool's threads have run in this process, a forked child (as a DataLoader
    worker is) makes its own pool instead of waiting on threads it does not have."""
    import multiprocessing as mp
    x, w, b, _ = _case(2048, 512, torch.float32, seed=3)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        want = F.layer_norm(x, (512,), w, b)                     # the pool's threads ran
        assert loops._pool
        ctx = mp.get_context("fork")
        with ctx.Pool(1) as pool:
            got = pool.apply_async(_layer_norm_in_child, (x, w, b)).get(timeout=30)
    finally:
        torch.set_num_threads(before)
    assert got == want.numpy().tobytes()


def _layer_norm_in_child(x, w, b):
    torch.set_num_threads(2)
    return F.layer_norm(x, (512,), w, b).numpy().tobytes()   # not a tensor: no fd sharing


@pytest.mark.parametrize("wanted", ["x", "weight", "bias", "all"])
def test_eval_batch_norm_on_channels_last_and_on_a_slice_of_it(monkeypatch, wanted):
    """BatchNorm in eval mode on channels_last memory: the backward's one compiled pass
    (normcore.positions.backward_fixed) gives torch's gradients, only those asked for, also for
    a slice of a channels_last tensor (channel-inner strides, not dense: x is copied, the
    gradient is fresh)."""
    calls = []
    real = positions.backward_fixed
    monkeypatch.setattr(positions, "backward_fixed", lambda *a: calls.append(1) or real(*a))
    gen = torch.Generator().manual_seed(6)
    full = torch.randn(4, 8, 10, 12, generator=gen, dtype=torch.float64).to(memory_format=CL)
    rm, rv = torch.randn(8, dtype=torch.float64), torch.rand(8, dtype=torch.float64) + 0.5
    w, b = torch.rand(8, dtype=torch.float64) + 0.5, torch.randn(8, dtype=torch.float64)
    for x in (full, full[:, :, 2:7]):
        leaves = {"x": x, "weight": w, "bias": b}
        got, ref = [], []
        for op, out in ((F.batch_norm, got), (TF.batch_norm, ref)):
            ts = {k: v.detach().clone(memory_format=torch.preserve_format).requires_grad_(
                wanted in (k, "all")) for k, v in leaves.items()}
            y = op(ts["x"], rm, rv, ts["weight"], ts["bias"], False)
            asked = [t for t in ts.values() if t.requires_grad]
            out.extend(torch.autograd.grad(y, asked, torch.ones_like(y)))
        for a, c in zip(got, ref):
            torch.testing.assert_close(a, c)
    assert len(calls) == 2
