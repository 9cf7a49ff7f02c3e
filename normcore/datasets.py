r"""Real data sets that need no download: scikit-learn's digits and MNIST-1D, built locally.

The synthetic stripes of the chapters train in a second, but every method separates them;
the claims of the papers are about real data.  Two small sets stand in for it, both made on
this machine with no network:

* :func:`digits`: the 1,797 handwritten digits that ship inside scikit-learn's wheel
  (``sklearn.datasets.load_digits``, the UCI optdigits test set), ``8 x 8`` images of pixel
  counts 0-16, about 180 of each of the 10 classes.  Images are returned as float32
  ``(N, 1, 8, 8)`` **scaled to [0, 1]** (the counts divided by 16, exact in float32; not
  standardized), split into train and test by a seeded, stratified split
  (``sklearn.model_selection.train_test_split``): by default 80% to train, 1,437 images,
  and 360 to test, 36 of each class (35 or 37 for a few).
* :func:`mnist1d`: MNIST-1D (Greydanus 2020), ten 1-D templates of the digits, each padded,
  sheared, scaled, translated and blurred with correlated and white noise into a signal of
  length 40: ``mnist1d.data.make_dataset`` with its default arguments
  (``get_dataset_args()``: 5,000 samples, 500 of each class, shuffled, the first 80% to train,
  seed 42).  The signals are returned as float32 ``(N, 1, 40)``, standardized over the whole
  set (``make_dataset`` subtracts the mean and divides by the standard deviation of all
  5,000 signals).  Its README reports test accuracies of 32% for logistic regression, 68% for
  an MLP and 94% for a CNN: it separates methods where MNIST does not.  It is *built*, never
  fetched: ``mnist1d.get_dataset`` downloads a pickle, and nothing here calls it.

``make_dataset`` seeds Python's and numpy's **global** random state
(``mnist1d.utils.set_seed``); :func:`mnist1d` saves both before and restores them after, so
the caller's random draws do not change.  Building takes about 1.5 s (and 1.5 s more to
import the package); the arrays are kept in memory per argument tuple and on disk as
``.npz`` under ``normcore.experiments.runner.cache_dir()/datasets`` (nothing is written when
``NORMCORE_CACHE=off``), so a notebook, or a worker process of a sweep, pays once.  Each
call returns fresh tensors: changing them in place does not change the next call's.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from ._extras import require

require(__name__)   # without normcore[book]: an ImportError that names it

import numpy as np  # noqa: E402 - imported once require() has checked the extra
import torch  # noqa: E402 - imported once require() has checked the extra

__all__ = ["Dataset", "digits", "mnist1d", "NUM_CLASSES"]

#: Both sets are digits 0-9.
NUM_CLASSES = 10
#: The pinned version of MNIST-1D (requirements.txt); a cached file records the version it
#: was built with, and another version builds again.
MNIST1D_VERSION = "0.0.2.post1"
_Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True, eq=False)
class Dataset:
    """A train and a test split: inputs ``x``, ``x_test`` (float32, channels first) and
    labels ``y``, ``y_test`` (int64, ``0 .. num_classes - 1``)."""

    name: str
    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    seed: int

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one input: ``(1, 8, 8)`` for digits, ``(1, 40)`` for MNIST-1D."""
        return tuple(self.x.shape[1:])

    def describe(self) -> str:
        """One line: the name, the sizes of the splits, the input shape, the classes, the seed."""
        shape = " x ".join(str(s) for s in self.sample_shape)
        return (f"{self.name}: {len(self.x)} train + {len(self.x_test)} test inputs of "
                f"{shape} ({str(self.x.dtype).removeprefix('torch.')}), "
                f"{self.num_classes} classes, seed {self.seed}")

    def digest(self) -> str:
        """A hash of the four arrays' bytes: the same seed gives the same digest everywhere."""
        h = hashlib.sha256()
        for t in (self.x, self.y, self.x_test, self.y_test):
            h.update(str(tuple(t.shape)).encode())
            h.update(t.numpy().tobytes())
        return h.hexdigest()[:16]


# --- arguments ----------------------------------------------------------------------------

def _check_seed(where: str, seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{where}: seed must be an int, got {seed!r}")
    if not 0 <= seed < 2 ** 32:
        raise ValueError(f"{where}: seed must lie in [0, 2**32) (numpy's seeds), got {seed}")
    return int(seed)


def _check_split(where: str, n: int, train_fraction) -> int:
    """The number of training samples, ``int(n * train_fraction)``; each split must hold
    at least one sample of each class."""
    if isinstance(train_fraction, bool) or not isinstance(train_fraction, (int, float)):
        raise TypeError(f"{where}: train_fraction must be a number in (0, 1), "
                        f"got {train_fraction!r}")
    if not 0 < train_fraction < 1:
        raise ValueError(f"{where}: train_fraction must lie strictly between 0 and 1 (the "
                         f"share of samples to train on), got {train_fraction}")
    n_train = int(n * train_fraction)
    if min(n_train, n - n_train) < NUM_CLASSES:
        raise ValueError(f"{where}: train_fraction={train_fraction} of {n} samples leaves "
                         f"{n_train} to train and {n - n_train} to test; each split needs at "
                         f"least {NUM_CLASSES} (one per class): move train_fraction towards "
                         "0.5 or use more samples")
    return n_train


# --- the caches ---------------------------------------------------------------------------

@contextlib.contextmanager
def _global_random_state_kept():
    """Python's and numpy's global random states, restored on leaving the block."""
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def _disk_cached(name: str, ident: dict, build: Callable[[], _Arrays]) -> _Arrays:
    """``build()``'s four arrays, read from ``<cache>/datasets/<name>-<hash>.npz`` when a
    file made from the same ``ident`` is stored there, built and stored otherwise."""
    from .experiments.runner import cache_dir   # where the runs are cached: one setting

    store = cache_dir()
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    path = None if store is None else store / "datasets" / f"{name}-{key}.npz"
    if path is not None and path.exists():
        try:
            with np.load(path) as f:
                if json.loads(str(f["ident"])) == ident:
                    return f["x"], f["y"], f["x_test"], f["y_test"]
        except (OSError, ValueError, KeyError):
            pass                                     # a damaged file: build again
    arrays = build()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, ident=json.dumps(ident, sort_keys=True),
                 **dict(zip(("x", "y", "x_test", "y_test"), arrays)))
        tmp.replace(path)
    return arrays


def _frozen(arrays: _Arrays) -> _Arrays:
    for a in arrays:
        a.setflags(write=False)
    return arrays


def _dataset(name: str, arrays: _Arrays, seed: int) -> Dataset:
    x, y, x_test, y_test = (torch.from_numpy(np.array(a)) for a in arrays)   # copies
    return Dataset(name, x, y, x_test, y_test, NUM_CLASSES, seed)


# --- digits -------------------------------------------------------------------------------

@lru_cache(maxsize=8)
def _digits_arrays(train_fraction: float, seed: int) -> _Arrays:
    def build() -> _Arrays:
        try:
            from sklearn.datasets import load_digits    # reads the wheel's own csv.gz
            from sklearn.model_selection import train_test_split
        except ImportError:
            raise ImportError("normcore.datasets.digits needs scikit-learn: pip install "
                              "scikit-learn (or normcore[data])") from None

        images, labels = load_digits(return_X_y=True)
        images = (images.reshape(-1, 1, 8, 8) / 16.0).astype(np.float32)   # counts 0..16
        x, x_test, y, y_test = train_test_split(
            images, labels.astype(np.int64), train_size=train_fraction, stratify=labels,
            random_state=seed)
        return x, y, x_test, y_test

    ident = {"set": "digits", "train_fraction": train_fraction, "seed": seed}
    return _frozen(_disk_cached("digits", ident, build))


def digits(*, train_fraction: float = 0.8, seed: int = 0) -> Dataset:
    """scikit-learn's 1,797 handwritten digits, ``(N, 1, 8, 8)`` in [0, 1], split by class.

    Args:
        train_fraction: the share of each class to train on (stratified); the default 0.8
            gives 1,437 training and 360 test images.
        seed: draws the split (``random_state`` of ``train_test_split``).
    Returns:
        :class:`Dataset` with float32 images scaled to [0, 1] and int64 labels 0-9.

    Examples::

        >>> digits().describe()
        'digits: 1437 train + 360 test inputs of 1 x 8 x 8 (float32), 10 classes, seed 0'
    """
    seed = _check_seed("digits", seed)
    _check_split("digits", 1797, train_fraction)
    return _dataset("digits", _digits_arrays(float(train_fraction), seed), seed)


# --- MNIST-1D -----------------------------------------------------------------------------

def _mnist1d_version() -> str:
    """The installed version of mnist1d, read without importing it (1.5 s: it imports
    matplotlib's pyplot and requests)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mnist1d")
    except PackageNotFoundError:
        raise ImportError(f"normcore.datasets.mnist1d needs the mnist1d package: "
                          f"pip install mnist1d=={MNIST1D_VERSION} (or normcore[data])") from None


@lru_cache(maxsize=8)
def _mnist1d_arrays(num_samples: int, seed: int, train_fraction: float) -> _Arrays:
    def build() -> _Arrays:
        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()            # the defaults, an ObjectView of a fresh dict
        args.num_samples, args.seed, args.train_split = num_samples, seed, train_fraction
        with _global_random_state_kept():     # make_dataset seeds both global generators
            d = make_dataset(args)           # built here; get_dataset() would download
        return (d["x"][:, None].astype(np.float32), d["y"].astype(np.int64),
                d["x_test"][:, None].astype(np.float32), d["y_test"].astype(np.int64))

    ident = {"set": "mnist1d", "version": _mnist1d_version(), "num_samples": num_samples, "seed": seed,
             "train_fraction": train_fraction}
    return _frozen(_disk_cached("mnist1d", ident, build))


def mnist1d(*, num_samples: int = 5000, seed: int = 42, train_fraction: float = 0.8) -> Dataset:
    """MNIST-1D built locally by ``mnist1d.data.make_dataset``: signals ``(N, 1, 40)``.

    Args:
        num_samples: how many signals, a multiple of 10 (the same number of each digit);
            the default 5,000 is the published set's size.
        seed: seeds the construction (the default 42 is the package's, which gives the
            published set); Python's and numpy's global random states are left as they were.
        train_fraction: the first ``int(num_samples * train_fraction)`` signals (after
            ``make_dataset``'s shuffle) train, the rest test: 4,000 and 1,000 by default.
    Returns:
        :class:`Dataset` with float32 signals standardized over the whole set and int64
        labels 0-9.

    Examples::

        >>> mnist1d().describe()
        'mnist1d: 4000 train + 1000 test inputs of 1 x 40 (float32), 10 classes, seed 42'
    """
    seed = _check_seed("mnist1d", seed)
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)):
        raise TypeError(f"mnist1d: num_samples must be an int, got {num_samples!r}")
    if num_samples < 2 * NUM_CLASSES or num_samples % NUM_CLASSES:
        raise ValueError(f"mnist1d: num_samples must be a multiple of {NUM_CLASSES} (the same "
                         f"number of each digit) and at least {2 * NUM_CLASSES} (one of each "
                         f"to train and one to test), got {num_samples}")
    _check_split("mnist1d", int(num_samples), train_fraction)
    arrays = _mnist1d_arrays(int(num_samples), seed, float(train_fraction))
    return _dataset("mnist1d", arrays, seed)

