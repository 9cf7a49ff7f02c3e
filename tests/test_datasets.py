"""normcore.datasets: digits and MNIST-1D, built locally, seeded, cached, and offline."""
from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

from normcore import datasets

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """No data set in memory, an empty disk cache, and a working directory of its own (where
    ``mnist1d.get_dataset`` would look for its pickle)."""
    monkeypatch.setenv("NORMCORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    datasets._digits_arrays.cache_clear()
    datasets._mnist1d_arrays.cache_clear()
    yield tmp_path / "cache"
    datasets._digits_arrays.cache_clear()
    datasets._mnist1d_arrays.cache_clear()


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NORMCORE_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield datasets.digits(), datasets.mnist1d()


def test_shapes_dtypes_and_ranges(both):
    dig, m1d = both
    assert dig.x.shape == (1437, 1, 8, 8) and dig.x_test.shape == (360, 1, 8, 8)
    assert m1d.x.shape == (4000, 1, 40) and m1d.x_test.shape == (1000, 1, 40)
    for d in both:
        assert d.x.dtype == d.x_test.dtype == torch.float32
        assert d.y.dtype == d.y_test.dtype == torch.int64
        assert len(d.y) == len(d.x) and len(d.y_test) == len(d.x_test)
        assert d.num_classes == 10 and set(d.y.tolist()) == set(range(10))
    assert dig.x.min() == 0 and dig.x.max() == 1                     # counts / 16
    assert torch.equal(dig.x * 16, (dig.x * 16).round())             # exact: 17 levels
    whole = torch.cat([m1d.x, m1d.x_test]).double()
    assert abs(float(whole.mean())) < 1e-6 and abs(float(whole.std()) - 1) < 1e-3
    assert dig.describe() == ("digits: 1437 train + 360 test inputs of 1 x 8 x 8 (float32), "
                              "10 classes, seed 0")
    assert m1d.describe() == ("mnist1d: 4000 train + 1000 test inputs of 1 x 40 (float32), "
                              "10 classes, seed 42")


def test_labels_are_balanced(both):
    dig, m1d = both
    total = torch.bincount(torch.cat([dig.y, dig.y_test]))
    test = torch.bincount(dig.y_test)                 # stratified: 20% of each class, +-1
    assert ((test - 0.2 * total).abs() <= 1).all()
    assert torch.equal(torch.bincount(torch.cat([m1d.y, m1d.y_test])), torch.full((10,), 500))
    assert torch.bincount(m1d.y_test).min() >= 80     # a shuffled cut: about 100 each


def test_the_same_arguments_give_the_same_bytes_and_fresh_tensors(both):
    dig, m1d = both
    again = datasets.digits(), datasets.mnist1d()
    for a, b in zip(both, again):
        assert a.digest() == b.digest() and a.x is not b.x
    again[1].x.zero_()                               # the caller's copy, not the cache's
    assert datasets.mnist1d().digest() == m1d.digest()
    assert datasets.digits(seed=1).digest() != dig.digest()
    assert datasets.mnist1d(num_samples=200, seed=1).digest() != m1d.digest()


def test_another_process_and_the_disk_cache_give_the_same_bytes(empty_cache, monkeypatch):
    code = ("from normcore import datasets; "
            "print(datasets.digits(seed=3).digest(), datasets.mnist1d(num_samples=500).digest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT,
                         env={**os.environ, "NORMCORE_CACHE": "off"}).stdout.split()
    built = [datasets.digits(seed=3).digest(), datasets.mnist1d(num_samples=500).digest()]
    assert out == built
    assert len(list((empty_cache / "datasets").glob("*.npz"))) == 2
    datasets._digits_arrays.cache_clear()
    datasets._mnist1d_arrays.cache_clear()
    import mnist1d.data

    def refuse(*args, **kwargs):
        raise AssertionError("built again: the disk cache was not read")

    monkeypatch.setattr(mnist1d.data, "make_dataset", refuse)
    read = [datasets.digits(seed=3).digest(), datasets.mnist1d(num_samples=500).digest()]
    assert read == built


def test_a_damaged_cache_file_is_built_again(empty_cache):
    first = datasets.mnist1d(num_samples=100).digest()
    (path,) = (empty_cache / "datasets").glob("mnist1d-*.npz")
    path.write_bytes(b"not an npz")
    datasets._mnist1d_arrays.cache_clear()
    assert datasets.mnist1d(num_samples=100).digest() == first


def test_the_callers_random_state_is_left_alone(empty_cache):
    random.seed(5)
    np.random.seed(5)
    expected = random.random(), np.random.rand()
    random.seed(5)
    np.random.seed(5)
    datasets.mnist1d(num_samples=100, seed=7)          # make_dataset seeds both with 7
    assert (random.random(), np.random.rand()) == expected


def test_no_code_path_reaches_the_network(empty_cache, monkeypatch):
    calls = []

    def refuse(*args, **kwargs):          # recorded too: a bare `except:` may swallow it
        calls.append(args[:2])
        raise AssertionError(f"a network call: {args[:2]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(requests, "get", refuse)
    monkeypatch.setattr(requests.Session, "request", refuse)
    with pytest.raises(AssertionError, match="a network call"):   # the guard is in place
        requests.get("https://example.org")
    calls.clear()
    dig, m1d = datasets.digits(), datasets.mnist1d()
    assert len(dig.x) + len(dig.x_test) == 1797 and len(m1d.x) == 4000
    assert len(list((empty_cache / "datasets").glob("*.npz"))) == 2
    assert not calls, f"the network was called: {calls}"
    assert not list(Path.cwd().glob("*.pkl"))                     # no get_dataset() pickle


@pytest.mark.parametrize("call, error, words", [
    (lambda: datasets.mnist1d(num_samples=5), ValueError, "multiple of 10"),
    (lambda: datasets.mnist1d(num_samples=105), ValueError, "multiple of 10"),
    (lambda: datasets.mnist1d(num_samples=10), ValueError, "at least 20"),
    (lambda: datasets.mnist1d(num_samples=50.0), TypeError, "num_samples must be an int"),
    (lambda: datasets.mnist1d(num_samples=100, train_fraction=0.95), ValueError,
     "95 to train and 5 to test"),
    (lambda: datasets.mnist1d(train_fraction=1.0), ValueError, "strictly between 0 and 1"),
    (lambda: datasets.digits(train_fraction=0), ValueError, "strictly between 0 and 1"),
    (lambda: datasets.digits(train_fraction="80%"), TypeError, "train_fraction must be"),
    (lambda: datasets.digits(train_fraction=0.999), ValueError, "each split needs"),
    (lambda: datasets.digits(seed=-1), ValueError, "seed must lie in"),
    (lambda: datasets.digits(seed=1.5), TypeError, "seed must be an int"),
    (lambda: datasets.mnist1d(seed=True), TypeError, "seed must be an int"),
])
def test_bad_arguments_are_named(call, error, words):
    with pytest.raises(error, match=words):
        call()
