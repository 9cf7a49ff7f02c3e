"""The compiled kernels (normcore.loops, normcore.positions, run by normcore.kernels): they are
the Python loops they are written as, take what normcore.dispatch.TABLE gives them when numba
is there and switched on, and only then, equal the reference (the formula and the boxed
backward) to a rounding, give results that do not depend on the number of threads, take a
second pass where the first cancels, keep their column sums small on long rows, and read no
module constant that numba's disk cache could freeze.  (Their accuracy against torch's:
tests/test_accuracy.py; batch invariance on both paths: tests/test_batch_invariance.py.)"""
from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as TF

import normcore.functional as F
import normcore
from normcore import axes, core, dispatch, grad, loops, positions


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
    assert dispatch.kernels_enabled()
    x, w, b, g = _case(7, 5)
    chunk, chunks = 3, 3
    outs = []
    for kernel in (lambda f: f, loops.compiled):
        y = torch.empty_like(x)
        stats = torch.empty(3, 7, dtype=torch.float64)
        kernel(loops.forward_rows)(x.numpy(), w.numpy(), b.numpy(), 1e-5, centered,
                                   loops.ONE_PASS_RATIO, y.numpy(), stats.numpy(), chunk, 0,
                                   chunks)
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


def test_layer_norms_take_the_kernels_as_the_table_says(monkeypatch):
    """At any size: float32 and float64 on the CPU, contiguous, switched on, numba there.
    Half precision, a non-contiguous input, the switch off, numba absent: the reference."""
    x, w, b, _ = _case(6, 8, torch.float32)
    calls = []
    real = loops.forward
    monkeypatch.setattr(loops, "forward", lambda *a: calls.append(1) or real(*a))
    F.layer_norm(x, (8,), w, b)
    F.layer_norm(x.double(), (8,), w.double(), b.double())
    assert calls == [1, 1]
    F.layer_norm(x.half(), (8,), w.half(), b.half())
    F.layer_norm(x[:, :4], (4,), w[:4], b[:4])
    with normcore.use_kernels(False):
        F.layer_norm(x, (8,), w, b)
    assert calls == [1, 1]
    monkeypatch.setitem(dispatch._STATE, "numba", None)
    monkeypatch.setitem(sys.modules, "numba", None)           # `import numba` raises
    assert not dispatch.kernels_enabled()
    F.layer_norm(x, (8,), w, b)
    assert calls == [1, 1]


def test_the_switch_is_read_at_the_call_and_restored():
    lay = axes.layout("layer", (4, 8), normalized_ndim=1)
    x = torch.randn(4, 8)
    assert dispatch.family(lay, x) == "rows"
    with normcore.use_kernels(False):
        assert dispatch.family(lay, x) is None
        assert normcore.explain(lay, x).startswith("reference")
        with normcore.use_kernels(True):
            assert dispatch.family(lay, x) == "rows"
        assert dispatch.family(lay, x) is None
    assert dispatch.family(lay, x) == "rows"
    with pytest.raises(TypeError, match="True or False"):
        normcore.use_kernels("0")


def test_the_environment_sets_the_default_once_at_import():
    """NORMCORE_KERNELS=0 switches the kernels off for the process; changing the variable
    afterwards changes nothing (nothing numeric is read from the environment per call)."""
    import os
    import subprocess
    code = ("import os, torch, normcore; from normcore import axes, dispatch; "
            "lay = axes.layout('layer', (4, 8), normalized_ndim=1); x = torch.randn(4, 8); "
            "a = dispatch.family(lay, x); os.environ['NORMCORE_KERNELS'] = '1'; "
            "print(a, dispatch.family(lay, x))")
    env = dict(os.environ, NORMCORE_KERNELS="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["None", "None"]


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
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    x[(slice(None),) + (0,) * (len(shape) - 1)] = 1e6     # each set's first value
    xc = x.contiguous(memory_format=fmt)
    lay = axes.layout(norm, shape, G, 1 if norm == "layer" else None)
    assert dispatch.family(lay, xc) is not None
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
    a slice of a channels_last tensor (cloned with its format: dense again)."""
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


# ---------------------------------------------------------------------------------------
# the kernels against the reference, every family of dispatch.TABLE
# ---------------------------------------------------------------------------------------
FAMILIES = {   # name: (norm, shape, G or normalized_ndim, memory format, family)
    "layer": ("layer", (5, 3, 7), 1, torch.contiguous_format, "rows"),
    "layer over (C, L)": ("layer", (4, 3, 7), 2, torch.contiguous_format, "rows"),
    "rms": ("rms", (5, 3, 7), 1, torch.contiguous_format, "rows"),
    "group": ("group", (4, 6, 5, 3), 3, torch.contiguous_format, "sets"),
    "instance": ("instance", (4, 6, 5, 3), None, torch.contiguous_format, "sets"),
    "group channels_last": ("group", (4, 6, 5, 3), 2, CL, "positions"),
    "instance channels_last": ("instance", (4, 6, 5, 3), None, CL, "positions"),
    "batch channels_last": ("batch", (4, 6, 5, 3), None, CL, "positions"),
    "batch": ("batch", (4, 6, 5, 3), None, torch.contiguous_format, "channels"),
    "batch (N, C, L)": ("batch", (4, 6, 7), None, torch.contiguous_format, "channels"),
    "batch (N, C)": ("batch", (9, 6), None, torch.contiguous_format, "positions"),
    "group channels_last_3d": ("group", (2, 6, 3, 4, 2), 3, torch.channels_last_3d, "positions"),
}


def _family_case(name, dtype):
    norm, shape, k, fmt, family = FAMILIES[name]
    lay = axes.layout(norm, shape, k if norm == "group" else None,
                      k if norm in ("layer", "rms") else None)
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(shape, generator=gen, dtype=dtype) * 2 + 3).contiguous(memory_format=fmt)
    w = torch.rand(lay.affine_shape, generator=gen, dtype=dtype) + 0.5
    b = torch.randn(lay.affine_shape, generator=gen, dtype=dtype)
    g = torch.randn(shape, generator=gen, dtype=dtype)
    return lay, x, w, b, g, family


def _through_normalize(lay, x, w, b, g, needs=(True, True, True), create_graph=False):
    leaves = [t.detach().clone(memory_format=torch.preserve_format).requires_grad_(n)
              for t, n in zip((x, w, b), needs)]
    y, mean, var, _, _ = grad.Normalize.apply(*leaves, lay, 1e-5)
    asked = [t for t in leaves if t.requires_grad]
    return (y, mean, var, *torch.autograd.grad(y, asked, g, create_graph=create_graph))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_kernels_equal_the_reference(name, dtype):
    """Each family against the reference (normcore.core's steps and the boxed backward):
    the output, the statistics and every gradient, to float64's roundings in float64 and to
    a few of float32's in float32; torch's memory format on both."""
    lay, x, w, b, g, family = _family_case(name, dtype)
    assert dispatch.family(lay, x) == family
    got = _through_normalize(lay, x, w, b, g)
    with normcore.use_kernels(False):
        assert dispatch.family(lay, x) is None
        want = _through_normalize(lay, x, w, b, g)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-5)
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c, **tol)
    fmt = core.output_format(lay, x)
    assert got[0].is_contiguous(memory_format=fmt) and want[0].is_contiguous(memory_format=fmt)


@pytest.mark.parametrize("needs", [(True, False, False), (False, True, False),
                                   (False, False, True), (True, True, False)])
@pytest.mark.parametrize("name", ["layer", "group", "batch channels_last"])
def test_the_kernels_give_only_the_gradients_asked_for(name, needs):
    lay, x, w, b, g, _ = _family_case(name, torch.float64)
    got = _through_normalize(lay, x, w, b, g, needs)
    with normcore.use_kernels(False):
        want = _through_normalize(lay, x, w, b, g, needs)
    assert len(got) == len(want) == 3 + sum(needs)
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["layer", "rms", "group channels_last"])
def test_the_kernels_are_twice_differentiable(name):
    """create_graph=True: the backward is the reference's on x_hat recomputed from x, so the
    second derivative exists and is the reference's."""
    lay, x, w, b, g, _ = _family_case(name, torch.float64)
    got = _through_normalize(lay, x, w, b, g, create_graph=True)
    with normcore.use_kernels(False):
        want = _through_normalize(lay, x, w, b, g, create_graph=True)
    for a, c in zip(got[3:5], want[3:5]):                 # dx, dgamma (dbeta = sum g)
        assert a.requires_grad and c.requires_grad
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------
# nothing the disk cache can freeze; the fast-math flag changes no float32 result
# ---------------------------------------------------------------------------------------
KERNELS = [loops.forward_rows, loops.backward_rows, loops.forward_sets, loops.backward_sets,
           loops.forward_channels, loops.backward_channels, loops.fixed_channels,
           loops.fixed_channels_backward,
           positions.position_sums, positions.sample_forward, positions.position_affine,
           positions.fixed_backward]
#: what a kernel may read from its module's globals: modules and builtins, never a number
ALLOWED_GLOBALS = {"math", "np", "range", "float", "min", "max", "int", "abs"}


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
def test_no_kernel_reads_a_module_constant(kernel):
    """numba's disk cache is keyed by the kernel's own source: a constant read from a module
    (positions froze loops.ONE_PASS_RATIO this way) would stay at its old value after the
    module changed.  Every value a kernel uses is an argument."""
    names = set(kernel.__code__.co_names) - {n for n in kernel.__code__.co_names
                                              if not hasattr(sys.modules[kernel.__module__], n)
                                              and n not in __builtins__}
    read = {n for n in names if n in vars(sys.modules[kernel.__module__]) or n in ALLOWED_GLOBALS}
    assert read <= ALLOWED_GLOBALS, read - ALLOWED_GLOBALS


def test_a_changed_constant_takes_effect_at_the_next_call(monkeypatch):
    """ONE_PASS_RATIO is passed at each call: raised past any cancellation, the outlier case
    of test_a_second_pass_where_the_first_cancels loses the second pass (and its accuracy) at
    once, with the kernels already compiled and cached."""
    shape = (3, 65536)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    x[:, 0] = 1e6
    lay = axes.layout("layer", shape, normalized_ndim=1)
    ref = core.normalize_formula(x, lay, 1e-5).output

    def err():
        return ((F.layer_norm(x, shape[-1:]) - ref).abs().max() / ref.abs().max()).item()

    assert err() <= 1e-13
    monkeypatch.setattr(loops, "ONE_PASS_RATIO", 1e300)
    assert err() > 1e-12
    monkeypatch.setattr(loops, "ONE_PASS_RATIO", 1e4)
    assert err() <= 1e-13


@pytest.mark.parametrize("name", ["layer", "group", "group channels_last"])
def test_the_fast_math_flag_changes_no_float32_result(monkeypatch, name):
    """loops.FASTMATH (reassoc: the float64 sums vectorized) against the kernels compiled with
    no fast-math flag: the float64 sums differ in their last bits, every float32 output and
    gradient by at most one float32 rounding (and almost always not at all)."""
    lay, x, w, b, g, _ = _family_case(name, torch.float32)
    got = _through_normalize(lay, x, w, b, g)
    real = loops.compiled
    monkeypatch.setattr(loops, "compiled", lambda f, fastmath=frozenset(): real(f, frozenset()))
    assert loops.compiled(loops.forward_rows) is not real(loops.forward_rows)
    strict = _through_normalize(lay, x, w, b, g)
    for a, c in zip(got, strict):
        ulp = torch.finfo(torch.float32).eps * c.abs().clamp_min(1e-30)
        assert ((a - c).abs() <= ulp).all()
