"""normcore.loops: the compiled row kernels are the Python loops they are written as, take
LayerNorm and RMSNorm when numba is there and only then, give results that do not depend on
the number of threads, and keep their column sums small on long rows.  (Against the formula,
the boxed backward and torch: tests/test_speed_paths.py, with the `row_path` fixture; their
accuracy against torch's: tests/test_accuracy.py.)"""
from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as TF

import normcore.functional as F
from normcore import axes, loops, rows


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


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_the_results_do_not_depend_on_the_thread_count(monkeypatch, norm):
    """Every output bit for bit the same on 1, 2 and 3 threads: rows split among threads by
    whole chunks, and the chunks' column sums added in one order."""
    monkeypatch.setattr(loops, "CHUNK_ELEMENTS", 4096)     # 64 chunks of 8 rows
    x, w, b, g = _case(512, 512, torch.float64, seed=2)     # float64: no rounding hides it
    x = x.repeat(4, 1)                                       # past rows.MIN_ELEMENTS
    g = g.repeat(4, 1)
    op = {"layer": lambda x, w, b: F.layer_norm(x, (512,), w, b),
          "rms": lambda x, w, b: F.rms_norm(x, (512,), w) + b}[norm]
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
    for other in got[1:]:
        for a, c in zip(got[0], other):
            assert torch.equal(a, c)


def test_long_rows_take_few_chunks():
    """The backward keeps two float64 rows of column sums per chunk: a LayerNorm over (C, H, W)
    (32 rows of 65536) takes 4 chunks, not 32 (33 MB of sums); short rows take 256 KB."""
    for rows_, n in [(32, 65536), (8192, 512), (3, 7), (100000, 3)]:
        chunk = loops._chunk(rows_, n)
        chunks = -(-rows_ // chunk)
        assert 16 * chunks * n <= max(loops.PARTS_BYTES, 16 * n), (rows_, n, chunks)
        assert chunks == 1 or chunk * n <= loops.CHUNK_ELEMENTS or 16 * chunks * n > loops.PARTS_BYTES // 2
    assert -(-32 // loops._chunk(32, 65536)) == 4
    assert loops._chunk(8192, 512) == 128


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
