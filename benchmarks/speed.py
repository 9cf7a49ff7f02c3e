"""Time normcore against torch's native ops, in one process, and print median ratios.

    .venv/bin/python benchmarks/speed.py [--reps 30] [--quick] [--per-call]
    .venv/bin/python benchmarks/speed.py --json normcore/cost.json [--reps 30] [--quick]

For each norm, forward and forward+backward, at a realistic size, the median wall time of
normcore and of torch are measured interleaved (A, B, A, B, ...) after a warm-up, so that
a noisy shared machine affects both alike.  The ratio is median(normcore) / median(torch);
the target is <= 2.0.  The column ``min`` is min(normcore) / min(torch), the ratio on the
least disturbed runs: on a loaded machine every full-size op waits for its threads to be
scheduled, and the medians move by several times from run to run while the minima stay.
This is a benchmark, not a test: it prints, it does not assert.  The rows named
``channels_last`` take the same input in that memory format (torch keeps it for BN and GN, and
so does normcore); ``--only TEXT`` measures only the rows whose name contains TEXT.
``--per-call`` times the same ops on small inputs (:data:`SIZES`), in microseconds: there a
call's fixed cost, its Python and its small torch ops, is most of its time (normcore's calls
are several times torch's), and the 2.0 target, set for the realistic sizes, is not applied.

``--reference`` switches the compiled kernels off (``normcore.use_kernels(False)``): every row
is then normcore's reference path, the formula in plain torch ops.

The table runs with the C library's heap as it is, as a user's program does; ``--steady-heap``
keeps it steady instead (:func:`steady_heap`: on glibc it runs again with :data:`STEADY_HEAP`):
with glibc's defaults, a freed full-size buffer often goes back to the OS, and the next one
costs a page fault per 4 KB page (about 2 us each here, 4-8 ms per call for the tensors
below).  Whether normcore's call or torch's pays depends on the order of earlier
allocations, not on the op: LayerNorm over the last dim fwd+bwd measured 1.1-1.6x torch's
time in runs where torch paid the faults, 2.1-2.6x where neither did, and RMSNorm's 0.16x
where torch paid 37000 faults a call, 0.45x where it paid none.  The column ``faults`` shows
what each side paid.

``--json PATH`` measures instead the layers of the chapter "Choosing a normalization" at one
realistic size, an image activation of shape (8, 64, 56, 56) (a ResNet's first stage; with
``--quick`` (8, 64, 28, 28)), with PyTorch and with normcore, forward and forward+backward,
beside two references: BatchNorm in eval mode and a 3x3 convolution from 64 to 64 channels on
the same tensor, in rounds that run every op once.  It writes the median and the minimum of
each over the rounds, in milliseconds, with the command, the machine and the date, to PATH
(the chapter reads ``normcore/cost.json`` through ``normcore.choose.load_cost``).  torch has
no op for WS and DyT: its column is the formula in plain torch ops (DyT per channel, as the
paper's code for (N, C, H, W)).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
import time

try:
    import resource        # minor page faults (POSIX)
except ImportError:       # Windows
    resource = None

import torch
import torch.nn.functional as TF

import normcore.functional as F

TARGET = 2.0


def _activation(shape, g: torch.Generator):
    """An activation of ``shape`` (N, C, ...), a per-channel gamma and beta drawn from ``g``
    in that order, and running statistics at their initial values."""
    x = torch.randn(shape, generator=g)
    C = shape[1]
    w, b = torch.rand(C, generator=g) + 0.5, torch.randn(C, generator=g)
    return x, w, b, torch.zeros(C), torch.ones(C)


#: the table's inputs (an image activation, a sequence, a conv weight) at each size: the
#: realistic one, ``--quick``'s smoke run, and ``--per-call``'s, small enough that a call's
#: fixed cost (its Python and its small ops) is most of its time
SIZES = {
    "full": {"image": (32, 64, 32, 32), "sequence": (32, 256, 512), "weight": (256, 128, 3, 3),
             "features": (4096, 512)},
    "quick": {"image": (8, 64, 32, 32), "sequence": (8, 128, 512), "weight": (256, 128, 3, 3),
              "features": (1024, 512)},
    "per-call": {"image": (2, 64, 4, 4), "sequence": (2, 4, 512), "weight": (16, 64, 3, 3),
                 "features": (8, 512)},
}


def _cases(size: str):
    g = torch.Generator().manual_seed(0)
    shapes = SIZES[size]
    big = shapes["image"]
    x, w, b, rm, rv = _activation(big, g)
    seq = torch.randn(shapes["sequence"], generator=g)
    wl, bl = torch.rand(512, generator=g) + 0.5, torch.randn(512, generator=g)
    conv_w = torch.randn(shapes["weight"], generator=g)
    feats = torch.randn(shapes["features"], generator=g)
    rm1, rv1 = torch.zeros(feats.shape[1]), torch.ones(feats.shape[1])
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
        # BatchNorm1d on features (N, C): the channels innermost
        ("batch_norm1d train", tuple(feats.shape), feats, [wl, bl],
         lambda x, w, b: F.batch_norm(x, rm1, rv1, w, b, True),
         lambda x, w, b: TF.batch_norm(x, rm1, rv1, w, b, True)),
        # BN with batch statistics and no buffers to update: the hand-derived Function alone
        ("batch_norm train, no buffers", big, x, [w, b],
         lambda x, w, b: F.batch_norm(x, None, None, w, b, True),
         lambda x, w, b: TF.batch_norm(x, None, None, w, b, True)),
    ]
    # channels_last inputs: torch's kernels keep the format (BN, GN); so does normcore
    xc = x.contiguous(memory_format=torch.channels_last)
    cl = "channels_last"
    cases += [
        (f"batch_norm train {cl}", big, xc, [w, b],
         lambda x, w, b: F.batch_norm(x, rm, rv, w, b, True),
         lambda x, w, b: TF.batch_norm(x, rm, rv, w, b, True)),
        (f"batch_norm eval {cl}", big, xc, [w, b],
         lambda x, w, b: F.batch_norm(x, rm, rv, w, b, False),
         lambda x, w, b: TF.batch_norm(x, rm, rv, w, b, False)),
        (f"instance_norm {cl}", big, xc, [w, b],
         lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
         lambda x, w, b: TF.instance_norm(x, weight=w, bias=b)),
        (f"group_norm G=32 {cl}", big, xc, [w, b],
         lambda x, w, b: F.group_norm(x, 32, w, b),
         lambda x, w, b: TF.group_norm(x, 32, w, b)),
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


#: glibc's malloc settings for the table (``GLIBC_TUNABLES``): freed memory is never given
#: back to the OS (trim threshold 1 GB), buffers up to 32 MB (every tensor here) come from the
#: heap rather than a fresh ``mmap``, and no per-thread cache of small chunks: torch allocates
#: with 64-byte alignment, whose small leftovers, held in that cache, kept two freed 8 MB
#: buffers apart, too short each for the next request, and the heap grew by 16 MB a call
STEADY_HEAP = ("glibc.malloc.tcache_count=0:glibc.malloc.trim_threshold=1073741824:"
               "glibc.malloc.mmap_threshold=33554432")


def steady_heap() -> bool:
    """Whether this process runs with :data:`STEADY_HEAP`; if it runs on glibc without any
    ``GLIBC_TUNABLES``, it is started again with them (glibc reads them at start only).  Then
    a freed full-size buffer is reused by the next call, by either side, without page
    faults.  False elsewhere (another C library, or tunables given): the defaults stay."""
    if os.environ.get("GLIBC_TUNABLES") == STEADY_HEAP:
        return True
    if platform.libc_ver()[0] != "glibc" or "GLIBC_TUNABLES" in os.environ:
        return False
    os.execve(sys.executable, [sys.executable, *sys.argv],
              {**os.environ, "GLIBC_TUNABLES": STEADY_HEAP})


#: the clock: wall time, or with ``--cpu-time`` the CPU time of this thread (one thread only)
CLOCK = time.perf_counter
#: minor page faults of the last timed call (-1 where the OS does not count them)
LAST_FAULTS = [0]


def _faults() -> int:
    """Minor page faults of this process so far: a fresh full-size buffer costs one per page
    touched, when the allocator took its memory from the OS rather than reusing its own."""
    if resource is None:
        return -1
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _time(run) -> float:
    f0 = _faults()
    t0 = CLOCK()
    run()
    t = CLOCK() - t0
    LAST_FAULTS[0] = _faults() - f0 if f0 >= 0 else -1
    return t


def interleaved(a, b, reps: int, warmup: int = 3):
    """Time ``a`` and ``b`` alternately (A, B, A, B, ...) after ``warmup`` calls of each:
    ``(median a, median b, their ratio, min(a) / min(b))``."""
    for _ in range(warmup):
        a(), b()
    ta, tb, fa, fb = [], [], [], []
    for _ in range(reps):
        ta.append(_time(a))
        fa.append(LAST_FAULTS[0])
        tb.append(_time(b))
        fb.append(LAST_FAULTS[0])
    FAULTS[:] = [statistics.median(fa), statistics.median(fb)]
    ma, mb = statistics.median(ta), statistics.median(tb)
    return ma, mb, ma / mb, min(ta) / min(tb)


#: median minor page faults per call of ``a`` and ``b`` in the last :func:`interleaved`
FAULTS = [0.0, 0.0]


def measure(reps: int, size: str, only: str | None = None):
    rows = []
    for name, shape, x, params, ours, theirs in _cases(size):
        if only and only not in name:
            continue
        for backward in (False, True):
            a, b = _runner(ours, x, params, backward), _runner(theirs, x, params, backward)
            ma, mb, ratio, min_ratio = interleaved(a, b, reps)
            rows.append((name, "fwd+bwd" if backward else "fwd", shape, ma, mb, ratio,
                         min_ratio, *FAULTS))
    return rows


# ---------------------------------------------------------------------------------------
# --json: the chapter "Choosing a normalization"
# ---------------------------------------------------------------------------------------
def _ws_torch(w):
    """WS in plain torch ops (the paper's code: unbiased std, eps added to it)."""
    flat = w.reshape(w.shape[0], -1)
    mean = flat.mean(1, keepdim=True)
    return ((flat - mean) / (flat.std(1, keepdim=True) + 1e-5)).reshape_as(w)


def _dyt_torch(x, alpha, w, b):
    """DyT in plain torch ops: gamma * tanh(alpha * x) + beta, per channel."""
    view = (1, -1) + (1,) * (x.dim() - 2)
    return w.view(view) * torch.tanh(alpha * x) + b.view(view)


def choose_cases(quick: bool):
    """(key, input, params, normcore fn or None, torch fn) for every row and reference."""
    g = torch.Generator().manual_seed(0)
    shape = (8, 64, 28, 28) if quick else (8, 64, 56, 56)
    x, w, b, rm, rv = _activation(shape, g)
    C = shape[1]
    wl, bl = torch.rand(shape[1:], generator=g) + 0.5, torch.randn(shape[1:], generator=g)
    conv_w = torch.randn(C, C, 3, 3, generator=g) * (2 / (9 * C)) ** 0.5
    alpha = torch.full((1,), 0.5)
    return shape, [
        ("batch", x, [w, b], lambda x, w, b: F.batch_norm(x, rm, rv, w, b, True),
         lambda x, w, b: TF.batch_norm(x, rm, rv, w, b, True)),
        ("layer", x, [wl, bl], lambda x, w, b: F.layer_norm(x, x.shape[1:], w, b),
         lambda x, w, b: TF.layer_norm(x, x.shape[1:], w, b)),
        ("rms", x, [wl], lambda x, w: F.rms_norm(x, x.shape[1:], w),
         lambda x, w: TF.rms_norm(x, list(x.shape[1:]), w)),
        ("instance", x, [], lambda x: F.instance_norm(x), lambda x: TF.instance_norm(x)),
        ("group", x, [w, b], lambda x, w, b: F.group_norm(x, 32, w, b),
         lambda x, w, b: TF.group_norm(x, 32, w, b)),
        ("ws", conv_w, [], lambda w: F.weight_standardize(w), _ws_torch),
        ("dyt", x, [alpha, w, b],
         lambda x, a, w, b: F.dyt(x, a, w, b, channels_last=False), _dyt_torch),
        ("batch eval", x, [w, b], lambda x, w, b: F.batch_norm(x, rm, rv, w, b, False),
         lambda x, w, b: TF.batch_norm(x, rm, rv, w, b, False)),
        ("conv3x3", x, [conv_w], None, lambda x, cw: TF.conv2d(x, cw, padding=1)),
    ]


def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    n = torch.get_num_threads()
    return (f"{model}, {os.cpu_count()} logical CPUs, {platform.system()}; "
            f"torch {torch.__version__} with {n} thread{'' if n == 1 else 's'}")


def dumps(data: dict) -> str:
    """The JSON of ``data``, indented, with each measurement and each short list on one line."""
    text = json.dumps(data, indent=1)
    text = re.sub(r'\{\s+"median": ([\d.]+),\s+"min": ([\d.]+)\s+\}',
                  r'{"median": \1, "min": \2}', text)
    text = re.sub(r'\[\s+([\d.,\s]+?)\s+\]',
                  lambda m: "[" + ", ".join(re.findall(r"[\d.]+", m[1])) + "]", text)
    return text + "\n"


def measure_json(reps: int, quick: bool, path: str) -> dict:
    shape, cases = choose_cases(quick)
    load_before = os.getloadavg()[0]
    runs = {}                                   # (key, who, pass) -> run
    for key, x, params, ours, theirs in cases:
        for backward in (False, True):
            kind = "fwd+bwd" if backward else "fwd"
            runs[key, "torch", kind] = _runner(theirs, x, params, backward)
            if ours is not None:
                runs[key, "normcore", kind] = _runner(ours, x, params, backward)
    for run in runs.values():                   # warm-up
        for _ in range(3):
            run()
    # round robin: every op once per round, so that a busy spell of a shared machine
    # falls on all of them alike; the minimum over the rounds is the least disturbed run
    samples = {k: [] for k in runs}
    for _ in range(reps):
        for k, run in runs.items():
            samples[k].append(_time(run))
    times = {key: {"torch": {}, "normcore": {} if ours is not None else None}
             for key, _, _, ours, _ in cases}
    for (key, who, kind), ts in samples.items():
        times[key][who][kind] = {"median": round(statistics.median(ts) * 1e3, 4),
                                 "min": round(min(ts) * 1e3, 4)}
    for key, t in times.items():
        print(f"{key:12s} " + "  ".join(f"{who} {k} {v['min']:.2f} ms" for who, tw in t.items()
                                        if tw for k, v in tw.items()), flush=True)
    data = {
        "command": "python benchmarks/speed.py " + " ".join(sys.argv[1:]),
        "machine": _machine(),
        "date": datetime.date.today().isoformat(),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "shape": list(shape), "dtype": "float32", "reps": reps,
        "note": ("milliseconds per call: the median and the minimum over reps rounds, each "
                 "round running every op once, after 3 warm-up runs of each; torch has no WS "
                 "or DyT op: its times are the formulas in plain torch ops; load_average: the "
                 "machine's 1-minute load average before and after"),
        "times": times,
    }
    with open(path, "w", encoding="utf-8") as f:
        f.write(dumps(data))
    return data


def normcore_kernels() -> bool:
    """Whether normcore's compiled kernels are on (``--reference`` switches them off)."""
    import normcore
    return normcore.kernels_enabled()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    ap.add_argument("--json", metavar="PATH",
                    help="measure the layers of the chapter 'Choosing a normalization' and "
                         "write them to PATH (normcore/cost.json)")
    ap.add_argument("--only", metavar="TEXT", help="measure only the ops whose name contains TEXT")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time the CPU time of this thread instead of the wall time (with "
                         "--threads 1): on a shared machine it leaves out the time the process "
                         "waits for a core, not the cost of page faults or a shared cache")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's); 1 is steadier on a shared machine")
    ap.add_argument("--per-call", action="store_true",
                    help="the same ops on small inputs (SIZES), in microseconds: the fixed cost "
                         "of a call, which the 2.0 target (for the realistic sizes) leaves out")
    ap.add_argument("--steady-heap", action="store_true",
                    help="run with a heap that keeps freed memory (glibc): no side pays page "
                         "faults for a fresh buffer")
    ap.add_argument("--reference", action="store_true",
                    help="switch normcore's compiled kernels off: every row is the reference")
    args = ap.parse_args()
    if args.per_call and args.json:
        ap.error("--per-call times the table's ops on small inputs and --json chapter 10's "
                 "layers: give one of them")
    steady = args.steady_heap and not args.json and steady_heap()      # may start it again
    if args.reference:
        import normcore
        normcore.use_kernels(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cpu_time:
        if torch.get_num_threads() != 1:
            ap.error("--cpu-time counts this thread only: use it with --threads 1")
        global CLOCK
        CLOCK = time.thread_time
    if args.json:
        measure_json(args.reps, args.quick, args.json)
        return
    target = "per call on small inputs, not held to the target" if args.per_call else \
        f"target ratio <= {TARGET}"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, "
          f"{'CPU time of the thread' if args.cpu_time else 'wall time'}, "
          f"median of {args.reps} interleaved runs, "
          f"{'steady heap' if steady else 'default heap'}, "
          f"normcore's {'kernels' if normcore_kernels() else 'reference'}; {target}")
    size = "per-call" if args.per_call else "quick" if args.quick else "full"
    rows = measure(args.reps, size, args.only)
    unit, scale = ("us", 1e6) if args.per_call else ("ms", 1e3)
    print(f"{'op':30s} {'pass':8s} {'shape':20s} {'normcore ' + unit:>12s} {'torch ' + unit:>10s} "
          f"{'ratio':>6s} {'min':>6s} {'faults nc/th':>13s}")
    worst = 0.0
    for name, kind, shape, ma, mb, r, rmin, fa, fb in rows:
        flag = "" if r <= TARGET or args.per_call else "  > target"
        worst = max(worst, r)
        faults = f"{fa:6.0f}/{fb:<6.0f}" if fa >= 0 else f"{'-':>13s}"
        print(f"{name:30s} {kind:8s} {shape!s:20s} {ma * scale:12.2f} {mb * scale:10.2f} "
              f"{r:6.2f} {rmin:6.2f} {faults}{flag}")
    print("faults: median minor page faults per call, where a fresh buffer's memory came from "
          "the OS\n(each costs its page's zeroing; which side pays depends on the allocator's "
          "state, not only the op)")
    if args.per_call:
        print(f"largest ratio: {worst:.2f} (the fixed cost of a call: the target is for the "
              "realistic sizes of the table without --per-call)")
        return
    print(f"worst ratio: {worst:.2f} ({'within' if worst <= TARGET else 'above'} the {TARGET} target)")


if __name__ == "__main__":
    main()
