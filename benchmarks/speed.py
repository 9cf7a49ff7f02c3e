"""Time normcore against torch's native ops, in one process, and print median ratios.

    .venv/bin/python benchmarks/speed.py [--reps 30] [--quick]

For each norm, forward and forward+backward, at a realistic size, the median wall time of
normcore and of torch are measured interleaved (A, B, A, B, ...) after a warm-up, so that
a noisy shared machine affects both alike.  The ratio is median(normcore) / median(torch);
the target is <= 2.0.  The column ``min`` is min(normcore) / min(torch), the ratio on the
least disturbed runs: on a loaded machine every full-size op waits for its threads to be
scheduled, and the medians move by several times from run to run while the minima stay.
This is a benchmark, not a test: it prints, it does not assert.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as TF

import normcore.functional as F

try:  # the hand-derived backward passes, when present
    from normcore import grad as G
except ImportError:  # pragma: no cover
    G = None

TARGET = 2.0


def _cases(quick: bool):
    g = torch.Generator().manual_seed(0)
    big = (8, 64, 32, 32) if quick else (32, 64, 32, 32)
    x = torch.randn(big, generator=g)
    C = big[1]
    w, b = torch.rand(C, generator=g) + 0.5, torch.randn(C, generator=g)
    rm, rv = torch.zeros(C), torch.ones(C)
    seq = torch.randn((8, 128, 512) if quick else (32, 256, 512), generator=g)
    wl, bl = torch.rand(512, generator=g) + 0.5, torch.randn(512, generator=g)
    conv_w = torch.randn(256, 128, 3, 3, generator=g)
    alpha = torch.full((1,), 0.5)
    cases = [
        ("batch_norm train", big, x, [w, b],
         lambda x, w, b: F.batch_norm(x, rm, rv, w, b, True),
         lambda x, w, b: TF.batch_norm(x, rm, rv, w, b, True)),
        ("batch_norm eval", big, x, [w, b],
         lambda x, w, b: F.batch_norm(x, rm, rv, w, b, False),
         lambda x, w, b: TF.batch_norm(x, rm, rv, w, b, False)),
        ("instance_norm", big, x, [w, b],
         lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
         lambda x, w, b: TF.instance_norm(x, weight=w, bias=b)),
        ("group_norm G=32", big, x, [w, b],
         lambda x, w, b: F.group_norm(x, 32, w, b),
         lambda x, w, b: TF.group_norm(x, 32, w, b)),
        ("layer_norm (C,H,W)", big, x, [],
         lambda x: F.layer_norm(x, x.shape[1:]),
         lambda x: TF.layer_norm(x, x.shape[1:])),
        ("layer_norm last dim", tuple(seq.shape), seq, [wl, bl],
         lambda x, w, b: F.layer_norm(x, (512,), w, b),
         lambda x, w, b: TF.layer_norm(x, (512,), w, b)),
        ("rms_norm last dim", tuple(seq.shape), seq, [wl],
         lambda x, w: F.rms_norm(x, (512,), w),
         lambda x, w: TF.rms_norm(x, (512,), w)),
        ("rms_norm (C,H,W)", big, x, [],
         lambda x: F.rms_norm(x, x.shape[1:]),
         lambda x: TF.rms_norm(x, list(x.shape[1:]))),
        # torch has no DyT: the reference is the paper's code, the formula in plain torch ops
        ("dyt last dim", tuple(seq.shape), seq, [alpha, wl, bl],
         lambda x, a, w, b: F.dyt(x, a, w, b),
         lambda x, a, w, b: torch.tanh(a * x) * w + b),
        ("dyt (N,C,H,W) per channel", big, x, [alpha, w, b],
         lambda x, a, w, b: F.dyt(x, a, w, b, channels_last=False),
         lambda x, a, w, b: torch.tanh(a * x) * w[:, None, None] + b[:, None, None]),
        # torch has no native WS: the reference is timm's formulation on F.batch_norm
        ("weight_standardize", tuple(conv_w.shape), conv_w, [],
         lambda w: F.weight_standardize(w, convention="timm"),
         lambda w: TF.batch_norm(w.reshape(1, w.shape[0], -1), None, None, training=True,
                                 momentum=0.0, eps=1e-6).reshape_as(w)),
    ]
    if G is not None:
        cases += [
            ("grad.batch_norm_train", big, x, [w, b],
             lambda x, w, b: G.batch_norm_train(x, w, b),
             lambda x, w, b: TF.batch_norm(x, None, None, w, b, True)),
            ("grad.group_norm G=32", big, x, [w, b],
             lambda x, w, b: G.group_norm(x, 32, w, b),
             lambda x, w, b: TF.group_norm(x, 32, w, b)),
            ("grad.layer_norm last dim", tuple(seq.shape), seq, [wl, bl],
             lambda x, w, b: G.layer_norm(x, (512,), w, b),
             lambda x, w, b: TF.layer_norm(x, (512,), w, b)),
        ]
    return cases


def _runner(fn, x, params, backward: bool):
    if not backward:
        def run():
            with torch.no_grad():
                fn(x, *params)
        return run
    xs = x.detach().clone().requires_grad_(True)
    ps = [p.detach().clone().requires_grad_(True) for p in params]
    dy = torch.randn_like(x)

    def run():
        y = fn(xs, *ps)
        y.backward(dy)
        xs.grad = None
        for p in ps:
            p.grad = None
    return run


def _time(run) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def measure(reps: int, quick: bool):
    rows = []
    for name, shape, x, params, ours, theirs in _cases(quick):
        for backward in (False, True):
            a, b = _runner(ours, x, params, backward), _runner(theirs, x, params, backward)
            for _ in range(3):  # warm-up
                a(), b()
            ta, tb = [], []
            for _ in range(reps):
                ta.append(_time(a))
                tb.append(_time(b))
            ma, mb = statistics.median(ta), statistics.median(tb)
            rows.append((name, "fwd+bwd" if backward else "fwd", shape, ma, mb, ma / mb,
                         min(ta) / min(tb)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, "
          f"median of {args.reps} interleaved runs; target ratio <= {TARGET}")
    rows = measure(args.reps, args.quick)
    print(f"{'op':26s} {'pass':8s} {'shape':20s} {'normcore ms':>12s} {'torch ms':>10s} "
          f"{'ratio':>6s} {'min':>6s}")
    worst = 0.0
    for name, kind, shape, ma, mb, r, rmin in rows:
        flag = "" if r <= TARGET else "  > target"
        worst = max(worst, r)
        print(f"{name:26s} {kind:8s} {str(shape):20s} {ma * 1e3:12.2f} {mb * 1e3:10.2f} {r:6.2f} "
              f"{rmin:6.2f}{flag}")
    print(f"worst ratio: {worst:.2f} ({'within' if worst <= TARGET else 'above'} the {TARGET} target)")


if __name__ == "__main__":
    main()
